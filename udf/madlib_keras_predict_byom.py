from madlib_mop.api.inference import predict_byom
from madlib_mop.plpy_bridge import run

# The numeric pred_type overloads (as MADlib's) have no dependent_count argument.
run(plpy, predict_byom, model_arch_table, model_id, test_table, id_col, independent_varname, output_table, pred_type, use_gpus, class_values, normalizing_const, globals().get("dependent_count", 1))
