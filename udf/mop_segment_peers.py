from madlib_mop.plpy_bridge import run
from madlib_mop.segment.kept_states import reachable

return run(plpy, reachable, server_names)
