from madlib_mop.plpy_bridge import run
from madlib_mop.api.runtime_check import version

return run(plpy, version)
