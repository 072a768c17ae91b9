from madlib_mop.api.steering import stop_model
from madlib_mop.plpy_bridge import run

return run(plpy, stop_model, job_id, mst_key)
