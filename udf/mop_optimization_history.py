from madlib_mop.api.analysis import optimization_history
from madlib_mop.plpy_bridge import run

return run(plpy, optimization_history, job_id)
