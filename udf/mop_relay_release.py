from madlib_mop.plpy_bridge import run
from madlib_mop.engine.relay import release

return run(plpy, release)
