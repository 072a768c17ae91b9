from madlib_mop.api.steering import add_model_config
from madlib_mop.plpy_bridge import run

return run(plpy, add_model_config, job_id, model_id, compile_params, fit_params)
