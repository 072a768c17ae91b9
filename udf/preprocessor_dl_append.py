from madlib_mop.plpy_bridge import run
from madlib_mop.api.preprocessor import preprocessor_dl_append

return run(plpy, preprocessor_dl_append, packed_table, source_table)
