from madlib_mop.api.converters import bytea_to_array
from madlib_mop.plpy_bridge import run_pure

return run_pure(plpy, bytea_to_array, var, element)
