-- Model catalogs: architectures and model selection tables (MADlib's API).

CREATE FUNCTION @extschema@.load_keras_model(
    keras_model_arch_table varchar,
    model_arch             json,
    model_weights          bytea DEFAULT NULL,
    name                   text  DEFAULT NULL,
    description            text  DEFAULT NULL
)
RETURNS void
#plpython "load_keras_model.py"

CREATE FUNCTION @extschema@.delete_keras_model(
    keras_model_arch_table varchar,
    model_id               integer
)
RETURNS void
#plpython "delete_keras_model.py"

CREATE FUNCTION @extschema@.generate_model_configs(
    model_arch_table      varchar,
    model_selection_table varchar,
    model_id_list         integer[],
    compile_params_grid   varchar,
    fit_params_grid       varchar,
    search_type           varchar DEFAULT 'grid',
    num_configs           integer DEFAULT NULL,
    random_state          integer DEFAULT NULL,
    object_table          varchar DEFAULT NULL
)
RETURNS void
#plpython "generate_model_configs.py"

CREATE FUNCTION @extschema@.load_model_selection_table(
    model_arch_table      varchar,
    model_selection_table varchar,
    model_id_list         integer[],
    compile_params_list   varchar[],
    fit_params_list       varchar[],
    object_table          varchar DEFAULT NULL
)
RETURNS void
#plpython "load_model_selection_table.py"
