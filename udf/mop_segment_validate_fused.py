from madlib_mop.plpy_bridge import run
from madlib_mop.segment.kept_states import validate_fused

return run(plpy, validate_fused, job_id, mst_keys, steps, partition, states_from)
