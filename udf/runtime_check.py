from madlib_mop.plpy_bridge import run
from madlib_mop.api.runtime_check import runtime_check

return run(plpy, runtime_check, source_table, dependent_varname, independent_varname, epochs, seed)
