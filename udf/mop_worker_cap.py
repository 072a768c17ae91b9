from madlib_mop.engine.server_slots import cap
from madlib_mop.plpy_bridge import run

return run(plpy, cap)
