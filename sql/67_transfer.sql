-- Transfer learning's explicit form (madlib_mop.api.transfer): a layer's features of a stored
-- model written once into a packed table, for later jobs to train heads on.  (A job stages
-- its models' frozen first layers by itself: madlib_mop.runtime.staging.)

-- Staged features, kept across jobs (madlib_mop.segment.features): a packed table's buffer
-- through a frozen prefix (its digest: the layers and their weights), computed once by
-- whichever worker session needs it first, then read by the others, in this job and the
-- next.  A buffer of a table packed in key order that grows is computed again (its rows
-- are part of the key).  A cache: unlogged, each role's rows its own.
CREATE UNLOGGED TABLE @extschema@.staged_features (
    owner     name NOT NULL DEFAULT current_user,
    source    oid NOT NULL,        -- the packed table (a segment server's: its own table)
    segment   integer NOT NULL,
    prefix    text NOT NULL,       -- the frozen layers' digest
    buffer_id integer NOT NULL,
    rows      integer NOT NULL,    -- the buffer's rows
    x bytea NOT NULL, xs integer[] NOT NULL, y bytea NOT NULL, ys integer[] NOT NULL,
    PRIMARY KEY (owner, source, segment, prefix, buffer_id, rows)
);
COMMENT ON TABLE @extschema@.staged_features IS
    'Staged features kept across jobs: a buffer through a frozen prefix, computed once (a cache; each role sees its own)';
ALTER TABLE @extschema@.staged_features ALTER COLUMN x SET STORAGE EXTERNAL;
ALTER TABLE @extschema@.staged_features ENABLE ROW LEVEL SECURITY;
CREATE POLICY staged_features_of_their_owner ON @extschema@.staged_features
    USING (owner = current_user) WITH CHECK (owner = current_user);
GRANT SELECT, DELETE ON @extschema@.staged_features TO PUBLIC;
GRANT INSERT (source, segment, prefix, buffer_id, rows, x, xs, y, ys) ON @extschema@.staged_features TO PUBLIC;

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

-- On a segment server: the features of its segments of a packed table, into its partitions
-- of the output (materialize_features of a table whose segments lie on segment servers).
CREATE FUNCTION @extschema@._mop_segment_materialize(task jsonb, weights bytea)
RETURNS jsonb
#plpython "mop_segment_materialize.py"

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
