from madlib_mop.runtime.plpy_bridge import run
from madlib_mop.segment.worker import warm_up

run(plpy, warm_up, segments)
