from madlib_mop.plpy_bridge import run
from madlib_mop.engine.relay import adopt

return run(plpy, adopt, local_segments, label)
