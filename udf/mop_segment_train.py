from madlib_mop.plpy_bridge import run
from madlib_mop.segment.kept_states import train

return run(plpy, train, job_id, mst_key, step, segment, state_from, model_state, forget_below)
