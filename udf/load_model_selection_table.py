from madlib_mop.api.model_catalog import load_model_selection_table
from madlib_mop.plpy_bridge import run

run(plpy, load_model_selection_table, model_arch_table, model_selection_table, model_id_list,
    compile_params_list, fit_params_list, object_table)
