from madlib_mop.api.analysis import pareto_front
from madlib_mop.plpy_bridge import run

return run(plpy, pareto_front, model_output_table, objectives)
