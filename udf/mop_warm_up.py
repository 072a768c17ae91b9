from madlib_mop.plpy_bridge import run
from madlib_mop.segment.worker import warm_up

run(plpy, warm_up, segments)
