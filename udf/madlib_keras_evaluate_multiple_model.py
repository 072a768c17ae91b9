from madlib_mop.api.inference import evaluate_multiple
from madlib_mop.plpy_bridge import run

run(plpy, evaluate_multiple, model_table, test_table, output_table, use_gpus)
