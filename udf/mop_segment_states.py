from madlib_mop.plpy_bridge import run
from madlib_mop.segment.kept_states import serve_several

return run(plpy, serve_several, store, mst_keys, steps)
