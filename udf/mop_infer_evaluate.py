from madlib_mop.segment.inference import worker_evaluate
from madlib_mop.plpy_bridge import run

return run(plpy, worker_evaluate, task, partition)
