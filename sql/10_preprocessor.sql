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
    regression          boolean   DEFAULT FALSE, -- TRUE: numeric labels are targets, not classes
    key_column          text      DEFAULT NULL   -- rows packed in its order: preprocessor_dl_append adds new ones
)
RETURNS void
#plpython "training_preprocessor_dl.py"

COMMENT ON FUNCTION @extschema@.training_preprocessor_dl(varchar, varchar, varchar, varchar, integer, double precision, integer[], text, integer, boolean, text) IS
    'Shuffles and packs a table into minibatch buffers spread over segments; SELECT training_preprocessor_dl(''help'') for usage';

CREATE FUNCTION @extschema@.validation_preprocessor_dl(
    source_table                varchar,
    output_table                varchar,
    dependent_varname           varchar,
    independent_varname         varchar,
    training_preprocessor_table varchar,
    buffer_size                 integer DEFAULT NULL,
    distribution_rules          text    DEFAULT NULL,
    key_column                  text    DEFAULT NULL  -- as training_preprocessor_dl's
)
RETURNS void
#plpython "validation_preprocessor_dl.py"

COMMENT ON FUNCTION @extschema@.validation_preprocessor_dl(varchar, varchar, varchar, varchar, varchar, integer, text, text) IS
    'Packs validation data with the class values and normalizing constant of a training table; SELECT validation_preprocessor_dl(''help'') for usage';

CREATE FUNCTION @extschema@.preprocessor_dl_append(
    packed_table varchar,  -- packed with key_column
    source_table varchar   -- the grown table, or a table or view of new rows
)
RETURNS bigint
#plpython "preprocessor_dl_append.py"

COMMENT ON FUNCTION @extschema@.preprocessor_dl_append(varchar, varchar) IS
    'Packs the rows whose key is above the last one packed into a table packed with key_column, as packing the grown table whole would; returns how many; SELECT preprocessor_dl_append(''help'') for usage';
