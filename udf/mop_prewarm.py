from madlib_mop.plpy_bridge import run
from madlib_mop.engine.prewarm import prewarm

return run(plpy, prewarm)
