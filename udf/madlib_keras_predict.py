from madlib_mop.api.inference import predict
from madlib_mop.plpy_bridge import run

run(plpy, predict, model_table, test_table, id_col, independent_varname, output_table, pred_type, use_gpus, mst_key)
