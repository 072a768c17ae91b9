from madlib_mop.plpy_bridge import run
from madlib_mop.segment.worker import evaluate

return run(plpy, evaluate, job_id, mst_key, step, partition, model_state)
