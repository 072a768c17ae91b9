"""Usage texts, returned when a function is called with no argument or 'help' (MADlib's way)."""

from __future__ import annotations

from typing import Any

from madlib_mop import errors
from madlib_mop.errors import MadlibMopError

TEXTS = {
    "training_preprocessor_dl": """
training_preprocessor_dl: shuffle a table once and pack it into minibatch buffers, spread
evenly over segments (one partition per segment), for madlib_keras_fit_multiple_model.

SELECT training_preprocessor_dl(
    source_table        varchar,   -- table or view with the training rows
    output_table        varchar,   -- packed table to create (and <output_table>_summary)
    dependent_varname   varchar,   -- label column: a scalar (text, integer, boolean, float)
                                   --   holds classes, NULL being one; a numeric array is
                                   --   one-hot already, as in MADlib; 'y1, y2': the
                                   --   outputs of a model of several, in its order
    independent_varname varchar,   -- a numeric array column of any shape; 'a, b': the
                                   --   inputs of a model of several, in its order
    buffer_size         integer   DEFAULT NULL,  -- rows per buffer (NULL: about 4 MiB)
    normalizing_const   real      DEFAULT 1.0,   -- features are divided by it
    num_classes         integer[] DEFAULT NULL,  -- e.g. ARRAY[10], one per label column;
                                                 --   NULL: the classes found
    distribution_rules  text      DEFAULT NULL,  -- NULL/'all_segments': setting
                                                 --   madlib_mop.segments, else one per CPU;
                                                 --   or a number of segments, e.g. '4'
    seed                integer   DEFAULT 0,     -- the shuffle's seed
    regression          boolean   DEFAULT FALSE, -- TRUE: numeric labels (or arrays of them)
                                                 --   are regression targets, not classes
    key_column          text      DEFAULT NULL   -- a unique column (id, timestamp): rows are
                                                 --   packed in its order, and
                                                 --   preprocessor_dl_append adds new ones
);

Output table: __dist_key__ (segment), <features> bytea (float32), <label> bytea (int16
one-hot, or float32 targets), <features>_shape, <label>_shape integer[], buffer_id; with
several feature or label columns, a pair of each.
Summary: source_table, output_table, dependent_varname, independent_varname,
dependent_vartype, <label>_class_values (one per label), buffer_size, normalizing_const, num_classes,
distribution_rules, __internal_gpu_config__, num_segments, num_rows, rows_per_segment,
buffers_per_segment, feature_shape, label_kind, shuffle_seed; packed with key_column, also
packed_by_key (the key column and type, the last key packed, rows, rows per buffer).
""",
    "validation_preprocessor_dl": """
validation_preprocessor_dl: pack validation rows like a training table, with its class
values, normalizing constant and segments (rows are not shuffled).

SELECT validation_preprocessor_dl(
    source_table                varchar,  -- table or view with the validation rows
    output_table                varchar,  -- packed table to create (and _summary)
    dependent_varname           varchar,  -- label column(s), as the training table's
    independent_varname         varchar,  -- the feature column(s), shaped as training
    training_preprocessor_table varchar,  -- output_table of training_preprocessor_dl
    buffer_size                 integer DEFAULT NULL,
    distribution_rules          text    DEFAULT NULL,  -- NULL: the training table's segments
    key_column                  text    DEFAULT NULL   -- as training_preprocessor_dl's
);
Labels must all be classes of the training table.
""",
    "preprocessor_dl_append": """
preprocessor_dl_append: pack the new rows of a growing table into a table packed with
key_column, without packing the rows packed before.

SELECT preprocessor_dl_append(
    packed_table varchar,  -- made by training_ or validation_preprocessor_dl with key_column
    source_table varchar   -- the grown table, or a table or view of new rows
);
Returns how many rows it packed: those whose key is above the last key packed (rows at or
below it are left out), with the packed table's normalizing constant and class values (a
class the packed table lacks is refused).  The packed table then holds the buffers that
packing the grown table whole (with the same key_column, buffer_size and seed) gives: rows
are placed by their rank in key order, so only the last buffer of each segment is written
again.  Refused while a job trains on the packed table.
""",
    "load_keras_model": """
load_keras_model: add a Keras architecture (and optional initial weights) to a model
architecture table, created if missing.

SELECT load_keras_model(
    keras_model_arch_table varchar,  -- model_id, model_arch, model_weights, name,
                                     --   description, __internal_madlib_id__
    model_arch             json,     -- model.to_json(): Keras 3, or tf.keras / Keras 2
    model_weights          bytea DEFAULT NULL,  -- float32 get_weights(), concatenated
    name                   text  DEFAULT NULL,
    description            text  DEFAULT NULL
);
The architecture is built in Keras' safe mode: Lambda layers and custom classes are refused.
Returns nothing; a NOTICE names the new model_id.
""",
    "delete_keras_model": """
delete_keras_model: remove one architecture from a model architecture table (the table
is dropped when it becomes empty).

SELECT delete_keras_model(
    keras_model_arch_table varchar,
    model_id               integer
);
""",
    "generate_model_configs": """
generate_model_configs: fill a model selection table with configurations from grids.

SELECT generate_model_configs(
    model_arch_table      varchar,   -- made by load_keras_model
    model_selection_table varchar,   -- created, or appended to (mst_key continues)
    model_id_list         integer[],
    compile_params_grid   varchar,   -- e.g. $${'loss': ['categorical_crossentropy'],
                                     --   'optimizer_params_list': [{'optimizer': ['Adam'],
                                     --   'lr': [0.001, 0.01]}], 'metrics': ['accuracy']}$$
    fit_params_grid       varchar,   -- e.g. $${'batch_size': [32, 64], 'epochs': [1]}$$
    search_type           varchar DEFAULT 'grid',  -- 'grid' or 'random'
    num_configs           integer DEFAULT NULL,    -- random search: how many
    random_state          integer DEFAULT NULL,    -- random search: seed
    object_table          varchar DEFAULT NULL     -- custom losses and metrics
                                                   --   (load_custom_function)
);
Grids are Python dict literals or JSON; every value is a list of choices.  Random search
also takes [low, high, 'linear' | 'log' | 'log_near_one'].  A metrics choice may be a
list of several metrics, e.g. 'metrics': [['accuracy', 'top_k_categorical_accuracy']].
Top-k accuracy for any k: 'top_3_accuracy'.  An optimizer's Keras 2 decay=d gives the
learning rate lr / (1 + d * step), as in Keras 2.
Output: mst_key, model_id, compile_params, fit_params; summary: model_arch_table,
object_table.
""",
    "load_model_selection_table": """
load_model_selection_table: create a model selection table from explicit lists.

SELECT load_model_selection_table(
    model_arch_table      varchar,
    model_selection_table varchar,     -- must not exist
    model_id_list         integer[],
    compile_params_list   varchar[],   -- e.g. ARRAY[$$loss='categorical_crossentropy',
                                       --   optimizer='Adam(lr=0.01)',metrics=['accuracy']$$]
    fit_params_list       varchar[],   -- e.g. ARRAY['batch_size=32,epochs=1']
    object_table          varchar DEFAULT NULL
);
The table holds every combination model_id x compile params x fit params.
""",
    "madlib_keras_fit_multiple_model": """
madlib_keras_fit_multiple_model: train every configuration of a model selection table at
once by model hopping; outputs <model_output_table>, _summary and _info (MADlib's columns).

SELECT madlib_keras_fit_multiple_model(
    source_table              varchar,   -- packed by training_preprocessor_dl
    model_output_table        varchar,   -- created (or continued: warm_start, resume)
    model_selection_table     varchar,   -- made by generate_model_configs
    num_iterations            integer,
    use_gpus                  boolean DEFAULT FALSE,   -- GPUs: not supported
    validation_table          varchar DEFAULT NULL,    -- packed by validation_preprocessor_dl
    metrics_compute_frequency integer DEFAULT NULL,    -- NULL: after the last iteration
    warm_start                boolean DEFAULT FALSE,
    name                      varchar DEFAULT NULL,
    description               varchar DEFAULT NULL,
    use_caching               boolean DEFAULT TRUE,
    seed                      integer DEFAULT 0,
    pruner                    varchar DEFAULT NULL,    -- stop weaker models early, e.g.
        -- 'median, warmup=2, interval=1, min_models=4' or
        -- 'successive_halving, eta=3, min_iterations=1', either with metric=..., direction=...
    if_output_exists          varchar DEFAULT 'error'  -- output of a finished job: 'error',
        -- or 'new_version': train into <model_output_table>_v2, _v3, ...
);
CALL fit_multiple(...) takes the same arguments and commits as the job goes; progress in
job_progress; CALL resume(job_id), or the same call again, continues an interrupted job.
""",
    "madlib_keras_automl": """
madlib_keras_automl: Hyperband or Hyperopt-style (TPE) model selection in one hopping job;
outputs <model_output_table>, _summary and _info (with s and i for Hyperband), and the
model selection table, which keeps the best configuration.

SELECT madlib_keras_automl(
    source_table              varchar,   -- packed by training_preprocessor_dl
    model_output_table        varchar,   -- created (the same call again resumes it)
    model_arch_table          varchar,   -- made by load_keras_model
    model_selection_table     varchar,   -- created: the configurations tried, then the best
    model_id_list             integer[],
    compile_params_grid       varchar,   -- as generate_model_configs': lists are choices,
    fit_params_grid           varchar,   --   [low, high, 'linear' | 'log' | 'log_near_one'] sampled
    automl_method             varchar DEFAULT 'hyperband',   -- or 'hyperopt'
    automl_params             varchar DEFAULT NULL,
        -- hyperband: 'R=6, eta=3, skip_last=0'
        -- hyperopt:  'num_configs=20, num_iterations=5, algorithm=tpe' (or rand),
        --            optionally parallelism=<segments>, startup_configs=...
        -- either: metric=validation_loss (default; training_loss without validation), direction=...
    random_state              integer DEFAULT NULL,   -- NULL: 0
    object_table              varchar DEFAULT NULL,   -- custom losses and metrics
    use_gpus                  boolean DEFAULT FALSE,  -- not supported
    validation_table          varchar DEFAULT NULL,
    metrics_compute_frequency integer DEFAULT NULL,
    name                      varchar DEFAULT NULL,
    description               varchar DEFAULT NULL,
    use_caching               boolean DEFAULT TRUE
);
CALL automl(...) takes the same arguments and commits as the job goes.
""",
    "hyperband_schedule": """
hyperband_schedule: Hyperband's brackets and rounds, as madlib_keras_automl runs them.

SELECT hyperband_schedule(
    schedule_table varchar,   -- created: s (bracket), i (round), n_i (configurations),
                              --          r_i (iterations each has had by the round's end)
    r              integer,   -- the most iterations one configuration gets, at least eta
    eta            integer DEFAULT 3,   -- keep the best 1/eta of a round
    skip_last      integer DEFAULT 0    -- drop the last rounds of every bracket
);
""",
    "madlib_keras_fit": """
madlib_keras_fit: train one configuration; outputs <model> (mst_key 1), <model>_summary
with MADlib's single-model columns, and <model>_info.

SELECT madlib_keras_fit(
    source_table              varchar,   -- packed by training_preprocessor_dl
    model                     varchar,   -- created
    model_arch_table          varchar,   -- made by load_keras_model
    model_id                  integer,
    compile_params            varchar,   -- e.g. $$loss='categorical_crossentropy',
                                         --   optimizer='Adam(lr=0.01)',metrics=['accuracy']$$
    fit_params                varchar,   -- e.g. 'batch_size=32,epochs=1'
    num_iterations            integer,
    use_gpus                  boolean DEFAULT FALSE,
    validation_table          varchar DEFAULT NULL,
    metrics_compute_frequency integer DEFAULT NULL,
    warm_start                boolean DEFAULT FALSE,
    name                      varchar DEFAULT NULL,
    description               varchar DEFAULT NULL,
    object_table              varchar DEFAULT NULL,   -- custom losses and metrics
    seed                      integer DEFAULT 0
);
""",
    "madlib_keras_evaluate": """
madlib_keras_evaluate: loss and metrics of a trained model on a packed table.

SELECT madlib_keras_evaluate(
    model_table  varchar,   -- made by madlib_keras_fit or madlib_keras_fit_multiple_model
    test_table   varchar,   -- packed by validation_preprocessor_dl
    output_table varchar,   -- created: loss, metric, metrics_type, loss_type, metrics
    use_gpus     boolean DEFAULT FALSE,
    mst_key      integer DEFAULT NULL     -- which model of a multiple-model table
);
madlib_keras_evaluate_multiple_model(model_table, test_table, output_table) evaluates every
model of the table (one row per mst_key).
""",
    "madlib_keras_predict": """
madlib_keras_predict: predictions of a trained model for the rows of a table.

SELECT madlib_keras_predict(
    model_table         varchar,   -- made by madlib_keras_fit or ..._fit_multiple_model
    test_table          varchar,   -- any table with the features
    id_col              varchar,
    independent_varname varchar,   -- the feature array column(s) the model was trained
                                   --   on ('a, b' for a model of two inputs)
    output_table        varchar,   -- created
    pred_type           varchar DEFAULT 'prob',   -- 'prob', 'response', an integer k (top
                                                  --   k classes) or a double precision
                                                  --   threshold (prob > it), e.g. 3 or 0.5
    use_gpus            boolean DEFAULT FALSE,
    mst_key             integer DEFAULT NULL      -- which model of a multiple-model table
);
Output: id, class_name, class_value, prob (and rank), or id, prediction for regression;
class_name is the label (a model of several outputs: rows for each; targets of several
outputs: id, class_name, prediction).
""",
    "madlib_keras_predict_byom": """
madlib_keras_predict_byom: predictions of a model brought from outside (its architecture
and weights loaded by load_keras_model).

SELECT madlib_keras_predict_byom(
    model_arch_table    varchar,
    model_id            integer,
    test_table          varchar,
    id_col              varchar,
    independent_varname varchar,
    output_table        varchar,   -- created
    pred_type           varchar DEFAULT 'prob',
    use_gpus            boolean DEFAULT FALSE,
    class_values        text[]  DEFAULT NULL,              -- NULL: classes 0 .. n-1; also
                                                           --   MADlib's ARRAY[ARRAY[...]],
                                                           --   a row per output
    normalizing_const   double precision DEFAULT NULL,     -- NULL: 1.0
    dependent_count     integer DEFAULT 1                  -- outputs of the model; with
                                                           --   several, class_name is
                                                           --   dependent_var_0, _1, ...
);
pred_type as in madlib_keras_predict.
""",
    "load_custom_function": """
load_custom_function: store a custom loss or metric (a Python function of (y_true, y_pred),
serialised by dill) in an object table, for compile_params to name it.

SELECT load_custom_function(
    object_table varchar,   -- created if it does not exist (id, name, description, object,
                            --   written_by), readable by every role
    object       bytea,     -- dill.dumps(function)
    name         text,      -- how compile_params names it, e.g. loss='focal_loss'
    description  text DEFAULT NULL
);
Only a superuser or a member of pg_execute_server_program may load a function: unpickling
runs code as the server's operating-system user.  Analysts then pass object_table to
load_model_selection_table, generate_model_configs, madlib_keras_fit or
madlib_keras_automl.  A worker runs an object only from a table such a role owns, from a
row such a role wrote (the table's trigger records the writer in written_by).
""",
    "delete_custom_function": """
delete_custom_function: delete a function from an object table (by id or by name); the
table is dropped with its last function when the caller owns it.

SELECT delete_custom_function(
    object_table varchar,
    id           integer   -- the function's id; or, as name text, its name
);
""",
    "load_top_k_accuracy_function": """
load_top_k_accuracy_function: store Keras' top-k categorical accuracy for one k as the
custom metric top_<k>_accuracy (as load_custom_function; the same roles may load it).

SELECT load_top_k_accuracy_function(
    object_table varchar,   -- created if it does not exist, as by load_custom_function
    k            integer    -- the function is named top_<k>_accuracy
);
(metrics=['top_3_accuracy'] also works without an object table: it is built in.)
""",
}

HELP_WORDS = {"", "help", "usage", "?"}


def usage(plpy: Any, function_name: str, message: str | None) -> str:
    if function_name not in TEXTS:
        raise MadlibMopError(f"no usage text for {function_name}",
                             sqlstate=errors.UNDEFINED_OBJECT,
                             hint="Functions with usage: " + ", ".join(sorted(TEXTS)) + ".")
    if (message or "").strip().lower() not in HELP_WORDS:
        return f'No such option. Use "SELECT {function_name}(\'help\')" for help.'
    return TEXTS[function_name].strip() + "\n"
