from madlib_mop.api.automl import madlib_keras_automl
from madlib_mop.plpy_bridge import run

run(plpy, madlib_keras_automl, source_table, model_output_table, model_arch_table,
    model_selection_table, model_id_list, compile_params_grid, fit_params_grid, automl_method,
    automl_params, random_state, object_table, use_gpus, validation_table,
    metrics_compute_frequency, name, description, use_caching, can_commit=CAN_COMMIT)
