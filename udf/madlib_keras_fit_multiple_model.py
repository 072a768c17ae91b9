from madlib_mop.api.fit import fit_multiple_model
from madlib_mop.plpy_bridge import run

run(plpy, fit_multiple_model, source_table, model_output_table, model_selection_table,
    num_iterations, use_gpus, validation_table, metrics_compute_frequency, warm_start, name,
    description, use_caching, seed, pruner, if_output_exists, can_commit=CAN_COMMIT)
