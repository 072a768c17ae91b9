from madlib_mop.plpy_bridge import run
from madlib_mop.segment.kept_states import held

return run(plpy, held, store, mst_keys, steps)
