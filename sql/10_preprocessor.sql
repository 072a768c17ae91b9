-- Data preparation: MADlib's training_preprocessor_dl and validation_preprocessor_dl.

CREATE FUNCTION @extschema@.training_preprocessor_dl(
    source_table        varchar,
    output_table        varchar,
    dependent_varname   varchar,
    independent_varname varchar,
    buffer_size         integer   DEFAULT NULL,
    normalizing_const   double precision DEFAULT 1.0,  -- MADlib: real; also takes float8 values
    num_classes         integer[] DEFAULT NULL,
    distribution_rules  text      DEFAULT NULL,
    seed                integer   DEFAULT 0,
    regression          boolean   DEFAULT FALSE  -- TRUE: numeric labels are targets, not classes
)
RETURNS void
#plpython "training_preprocessor_dl.py"

COMMENT ON FUNCTION @extschema@.training_preprocessor_dl(varchar, varchar, varchar, varchar, integer, double precision, integer[], text, integer, boolean) IS
    'Shuffles and packs a table into minibatch buffers spread over segments; SELECT training_preprocessor_dl(''help'') for usage';

CREATE FUNCTION @extschema@.validation_preprocessor_dl(
    source_table                varchar,
    output_table                varchar,
    dependent_varname           varchar,
    independent_varname         varchar,
    training_preprocessor_table varchar,
    buffer_size                 integer DEFAULT NULL,
    distribution_rules          text    DEFAULT NULL
)
RETURNS void
#plpython "validation_preprocessor_dl.py"

COMMENT ON FUNCTION @extschema@.validation_preprocessor_dl(varchar, varchar, varchar, varchar, varchar, integer, text) IS
    'Packs validation data with the class values and normalizing constant of a training table; SELECT validation_preprocessor_dl(''help'') for usage';
