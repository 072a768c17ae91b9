-- Transfer learning's explicit form (madlib_mop.api.transfer): a layer's features of a stored
-- model written once into a packed table, for later jobs to train heads on.  (A job stages
-- its models' frozen first layers by itself: madlib_mop.runtime.staging.)

CREATE FUNCTION @extschema@.materialize_features(
    model_table  varchar,   -- a fit's model_output_table, or a deployment's name
    source_table varchar,   -- packed by training_preprocessor_dl or validation_preprocessor_dl
    output_table varchar,   -- created: a packed table of the layer's output, and its _summary
    layer        varchar,   -- the layer's name, or its index in model.layers (0: the first)
    mst_key      integer DEFAULT NULL   -- which model of a fit_multiple output
)
RETURNS void
#plpython "materialize_features.py"
COMMENT ON FUNCTION @extschema@.materialize_features IS
    'Writes a layer''s output, for every row of a packed table, into a new packed table with the same segments, buffers and labels (a fit''s model, or a deployment''s)';

CREATE FUNCTION @extschema@.materialize_features_byom(
    model_arch_table varchar,   -- made by load_keras_model, the model loaded with its weights
    model_id         integer,
    source_table     varchar,
    output_table     varchar,
    layer            varchar
)
RETURNS void
#plpython "materialize_features_byom.py"
COMMENT ON FUNCTION @extschema@.materialize_features_byom IS
    'materialize_features for a model loaded with its weights by load_keras_model';

CREATE FUNCTION @extschema@.load_transfer_model(
    model_arch_table varchar,   -- where the new model goes (made if missing, as load_keras_model)
    base_table       varchar,   -- a fit's model_output_table or a deployment's name, or an
                                --   architecture table of load_keras_model's (a model with weights)
    base_id          integer,   -- the base's mst_key (NULL: madlib_keras_fit's one model), or model_id
    layer            varchar,   -- the last base layer kept: its name, or its index (0: the first)
    head             json,      -- the new layers: a JSON array of Keras layer configs
    name             varchar DEFAULT NULL,
    description      varchar DEFAULT NULL,
    seed             integer DEFAULT 0     -- the head's initial weights
)
RETURNS integer
#plpython "load_transfer_model.py"
COMMENT ON FUNCTION @extschema@.load_transfer_model IS
    'Adds to an architecture table a stored model''s first layers, frozen with their weights, under a new head; returns its model_id';
