from madlib_mop.plpy_bridge import run
from madlib_mop.api.preprocessor import training_preprocessor_dl

run(plpy, training_preprocessor_dl, source_table, output_table, dependent_varname,
    independent_varname, buffer_size, normalizing_const, num_classes, distribution_rules, seed,
    regression, key_column)
