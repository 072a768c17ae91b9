from madlib_mop.segment.inference import worker_predict
from madlib_mop.plpy_bridge import run

return run(plpy, worker_predict, task, first_block, last_block, weights)
