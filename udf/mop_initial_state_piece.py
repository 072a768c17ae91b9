from madlib_mop.plpy_bridge import run
from madlib_mop.segment.keras_work import initial_state_piece

return run(plpy, initial_state_piece, token, mst_key, at_byte)
