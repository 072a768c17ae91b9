from madlib_mop.api.deployments import deploy_model_by_strategy
from madlib_mop.plpy_bridge import run

return run(plpy, deploy_model_by_strategy, model_output_table, name, strategy, threshold, objective)
