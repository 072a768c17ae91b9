-- Evaluate and predict (MADlib's API), run on worker sessions in parallel.

CREATE FUNCTION @extschema@.madlib_keras_evaluate(
    model_table  varchar,
    test_table   varchar,
    output_table varchar,
    use_gpus     boolean DEFAULT FALSE,
    mst_key      integer DEFAULT NULL
)
RETURNS void
#plpython "madlib_keras_evaluate.py"

CREATE FUNCTION @extschema@.madlib_keras_evaluate_multiple_model(
    model_table  varchar,
    test_table   varchar,
    output_table varchar,
    use_gpus     boolean DEFAULT FALSE
)
RETURNS void
#plpython "madlib_keras_evaluate_multiple_model.py"
COMMENT ON FUNCTION @extschema@.madlib_keras_evaluate_multiple_model IS
    'Loss and metrics of every model of a multi-model output on a packed table, in one pass: one row per mst_key';

CREATE FUNCTION @extschema@.madlib_keras_predict(
    model_table         varchar,
    test_table          varchar,
    id_col              varchar,
    independent_varname varchar,
    output_table        varchar,
    pred_type           varchar DEFAULT 'prob',
    use_gpus            boolean DEFAULT FALSE,
    mst_key             integer DEFAULT NULL
)
RETURNS void
#plpython "madlib_keras_predict.py"

-- MADlib's pred_type overloads: an integer k (the top k classes) or a probability
-- threshold, written as numbers.
#overload pred_type integer
#overload pred_type double precision

-- Not in MADlib: every model of a multi-model output (or those of mst_keys) over one table,
-- each worker reading its rows once for all of them; fused where madlib_mop.fuse_models says.
CREATE FUNCTION @extschema@.madlib_keras_predict_multiple_model(
    model_table         varchar,
    test_table          varchar,
    id_col              varchar,
    independent_varname varchar,
    output_table        varchar,
    pred_type           varchar DEFAULT 'prob',
    use_gpus            boolean DEFAULT FALSE,
    mst_keys            integer[] DEFAULT NULL
)
RETURNS void
#plpython "madlib_keras_predict_multiple_model.py"
COMMENT ON FUNCTION @extschema@.madlib_keras_predict_multiple_model(varchar, varchar, varchar, varchar, varchar, varchar, boolean, integer[]) IS
    'Predictions of every model of a multi-model output (or of mst_keys) over one table, in one pass: madlib_keras_predict''s columns after mst_key';

#overload pred_type integer
#overload pred_type double precision

CREATE FUNCTION @extschema@.madlib_keras_predict_byom(
    model_arch_table    varchar,
    model_id            integer,
    test_table          varchar,
    id_col              varchar,
    independent_varname varchar,
    output_table        varchar,
    pred_type           varchar DEFAULT 'prob',
    use_gpus            boolean DEFAULT FALSE,
    class_values        text[]  DEFAULT NULL,   -- MADlib's 2-D form ARRAY[ARRAY[...]] too
    normalizing_const   double precision DEFAULT NULL,
    dependent_count     integer DEFAULT 1    -- outputs of the model
)
RETURNS void
#plpython "madlib_keras_predict_byom.py"

-- As MADlib: the numeric pred_type overloads have no dependent_count.
#overload pred_type integer WITHOUT dependent_count
#overload pred_type double precision WITHOUT dependent_count

-- Workers' entry points.
CREATE FUNCTION @extschema@._mop_infer_evaluate(task jsonb, partition integer)
RETURNS jsonb
#plpython "mop_infer_evaluate.py"

CREATE FUNCTION @extschema@._mop_infer_predict(task jsonb, first_block bigint, last_block bigint, weights bytea)
RETURNS jsonb
#plpython "mop_infer_predict.py"
