from madlib_mop.api.steering import set_model_iterations
from madlib_mop.plpy_bridge import run

return run(plpy, set_model_iterations, job_id, mst_key, num_iterations)
