from madlib_mop.api.analysis import intermediate_values
from madlib_mop.plpy_bridge import run

return run(plpy, intermediate_values, job_id)
