from madlib_mop.api.steering import clone_model
from madlib_mop.plpy_bridge import run

return run(plpy, clone_model, job_id, mst_key, compile_params, fit_params)
