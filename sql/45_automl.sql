-- AutoML (MADlib's madlib_keras_automl and hyperband_schedule): Hyperband and Hyperopt-style
-- search, each run as one model hopping job.

CREATE FUNCTION @extschema@.madlib_keras_automl(
    source_table              varchar,
    model_output_table        varchar,
    model_arch_table          varchar,
    model_selection_table     varchar,
    model_id_list             integer[],
    compile_params_grid       varchar,
    fit_params_grid           varchar,
    automl_method             varchar DEFAULT 'hyperband',  -- or 'hyperopt'
    automl_params             varchar DEFAULT NULL,  -- 'R=6, eta=3, skip_last=0' | 'num_configs=20, num_iterations=5, algorithm=tpe'
    random_state              integer DEFAULT NULL,
    object_table              varchar DEFAULT NULL,
    use_gpus                  boolean DEFAULT FALSE,
    validation_table          varchar DEFAULT NULL,
    metrics_compute_frequency integer DEFAULT NULL,
    name                      varchar DEFAULT NULL,
    description               varchar DEFAULT NULL,
    use_caching               boolean DEFAULT TRUE  -- MADlib's is FALSE; as our fit's
)
RETURNS void
#plpython "madlib_keras_automl.py"

-- CALL automl(...): the same call as a procedure, which commits as the job goes.
#procedure automl FROM madlib_keras_automl
COMMENT ON PROCEDURE @extschema@.automl IS
    'madlib_keras_automl as a procedure (CALL, outside a transaction block): the job commits as it goes';

-- Hyperband's brackets (s) and rounds (i): configurations n_i trained to r_i iterations.
CREATE FUNCTION @extschema@.hyperband_schedule(
    schedule_table varchar,
    r              integer,
    eta            integer DEFAULT 3,
    skip_last      integer DEFAULT 0
)
RETURNS void
#plpython "hyperband_schedule.py"
