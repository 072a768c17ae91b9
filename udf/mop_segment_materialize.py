from madlib_mop.plpy_bridge import run
from madlib_mop.segment.materialize import materialize_segments

return run(plpy, materialize_segments, task, weights)
