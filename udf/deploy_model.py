from madlib_mop.api.deployments import deploy_model
from madlib_mop.plpy_bridge import run

return run(plpy, deploy_model, model_output_table, mst_key, name)
