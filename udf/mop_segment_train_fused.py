from madlib_mop.plpy_bridge import run
from madlib_mop.segment.kept_states import train_fused

return run(plpy, train_fused, job_id, mst_keys, steps, segment, states_from, forget_below)
