from madlib_mop.api.inference import predict_multiple
from madlib_mop.plpy_bridge import run

run(plpy, predict_multiple, model_table, test_table, id_col, independent_varname, output_table, pred_type,
    use_gpus, mst_keys)
