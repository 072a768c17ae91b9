from madlib_mop.api.fit import fit_single_model
from madlib_mop.plpy_bridge import run

run(plpy, fit_single_model, source_table, model, model_arch_table, model_id, compile_params,
    fit_params, num_iterations, use_gpus, validation_table, metrics_compute_frequency,
    warm_start, name, description, object_table, seed)
