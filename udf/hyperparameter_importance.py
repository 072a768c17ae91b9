from madlib_mop.api.analysis import hyperparameter_importance
from madlib_mop.plpy_bridge import run

return run(plpy, hyperparameter_importance, model_output_table, objective, evaluator, iteration)
