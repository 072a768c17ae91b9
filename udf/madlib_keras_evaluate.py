from madlib_mop.api.inference import evaluate
from madlib_mop.plpy_bridge import run

run(plpy, evaluate, model_table, test_table, output_table, use_gpus, mst_key)
