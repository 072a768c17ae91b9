from madlib_mop.plpy_bridge import run
from madlib_mop.api.usage import usage

return run(plpy, usage, function_name, message)
