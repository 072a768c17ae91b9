from madlib_mop.api.model_catalog import generate_model_configs
from madlib_mop.plpy_bridge import run

run(plpy, generate_model_configs, model_arch_table, model_selection_table, model_id_list,
    compile_params_grid, fit_params_grid, search_type, num_configs, random_state, object_table)
