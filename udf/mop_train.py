from madlib_mop.plpy_bridge import run
from madlib_mop.segment.worker import train

return run(plpy, train, job_id, mst_key, step, segment, model_state)
