from madlib_mop.plpy_bridge import run
from madlib_mop.segment.inference import segment_evaluate

return run(plpy, segment_evaluate, task, partition, weights)
