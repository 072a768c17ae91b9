from madlib_mop.api.converters import array_to_bytea
from madlib_mop.plpy_bridge import run_pure

return run_pure(plpy, array_to_bytea, var, element)
