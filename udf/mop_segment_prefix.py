from madlib_mop.plpy_bridge import run
from madlib_mop.segment.kept_states import serve_prefix

return run(plpy, serve_prefix, store, digest)
