from madlib_mop.plpy_bridge import run
from madlib_mop.segment.worker import evaluate_fused

return run(plpy, evaluate_fused, job_id, mst_keys, steps, partition)
