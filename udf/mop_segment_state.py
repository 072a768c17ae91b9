from madlib_mop.plpy_bridge import run
from madlib_mop.segment.kept_states import serve

return run(plpy, serve, store, mst_key, step, whole)
