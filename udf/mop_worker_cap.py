from madlib_mop.engine.server_pool import cap
from madlib_mop.plpy_bridge import run

return run(plpy, cap)
