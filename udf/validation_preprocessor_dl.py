from madlib_mop.plpy_bridge import run
from madlib_mop.api.preprocessor import validation_preprocessor_dl

run(plpy, validation_preprocessor_dl, source_table, output_table, dependent_varname,
    independent_varname, training_preprocessor_table, buffer_size, distribution_rules,
    key_column)
