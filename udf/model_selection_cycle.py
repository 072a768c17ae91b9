from madlib_mop.api.cycles import run_cycle
from madlib_mop.plpy_bridge import run

run(plpy, run_cycle, cycle_name, packed_table, source_table, model_selection_table,
    num_iterations, validation_table, validation_source, top_k, metrics_compute_frequency, seed,
    can_commit=CAN_COMMIT)
