from madlib_mop.plpy_bridge import run
from madlib_mop.segment.kept_states import validate

return run(plpy, validate, job_id, mst_key, step, partition, state_from, model_state)
