-- The model catalogs, the converters and the helpers, each with its documented example and
-- its errors (SQLSTATE, message, HINT), as a psql script runs them.
\set SHOW_CONTEXT never
\set VERBOSITY default
SET search_path = public, madlib_mop;
-- load_keras_model creates the table at the first model; a second model gets the next id
SELECT load_keras_model('cat_arch',
    '{"class_name": "Sequential", "config": {"name": "mlp", "layers": [
        {"class_name": "Dense", "config": {"units": 4, "activation": "relu", "batch_input_shape": [null, 2]}},
        {"class_name": "Dense", "config": {"units": 3, "activation": "softmax"}}]}}', NULL, 'mlp', 'a small MLP');
SELECT load_keras_model('cat_arch',
    '{"class_name": "Sequential", "config": {"name": "wide", "layers": [
        {"class_name": "Dense", "config": {"units": 16, "activation": "relu", "batch_input_shape": [null, 2]}},
        {"class_name": "Dense", "config": {"units": 3, "activation": "softmax"}}]}}', NULL, 'wide');
SELECT model_id, name, description, model_weights IS NULL AS no_weights FROM cat_arch ORDER BY model_id;
-- weights that do not fit the architecture; JSON that is not a Keras model
SELECT load_keras_model('cat_arch', (SELECT model_arch::text FROM cat_arch WHERE model_id = 1)::json,
                        '\x00000000'::bytea);
SELECT load_keras_model('cat_arch', '{"layers": []}');
SELECT load_keras_model('cat_arch', NULL);
-- generate_model_configs: the grid (every combination), then random search appends
SELECT generate_model_configs('cat_arch', 'cat_mst', ARRAY[1, 2],
    $${'loss': ['categorical_crossentropy'], 'optimizer_params_list': [{'optimizer': ['Adam'], 'lr': [0.01, 0.001]}], 'metrics': ['accuracy']}$$,
    $${'batch_size': [8], 'epochs': [1]}$$);
SELECT generate_model_configs('cat_arch', 'cat_mst', ARRAY[1],
    $${'loss': ['categorical_crossentropy'], 'optimizer_params_list': [{'optimizer': ['SGD'], 'lr': [0.0001, 0.1, 'log'], 'momentum': [0.9]}], 'metrics': ['accuracy']}$$,
    $${'batch_size': [4, 8], 'epochs': [1]}$$, 'random', 2, 7);
SELECT mst_key, model_id, compile_params, fit_params FROM cat_mst ORDER BY mst_key;
SELECT * FROM cat_mst_summary;
-- a grid that is code; random search without num_configs; an unknown search type
SELECT generate_model_configs('cat_arch', 'cat_mst2', ARRAY[1], $${'loss': [exec('x')]}$$, $${'epochs': [1]}$$);
SELECT generate_model_configs('cat_arch', 'cat_mst2', ARRAY[1], $${'loss': ['mse']}$$, $${'epochs': [1]}$$, 'random');
SELECT generate_model_configs('cat_arch', 'cat_mst2', ARRAY[1], $${'loss': ['mse']}$$, $${'epochs': [1]}$$, 'bayes');
SELECT generate_model_configs('cat_arch', 'cat_mst2', ARRAY[9], $${'loss': ['mse']}$$, $${'epochs': [1]}$$);
-- load_model_selection_table: every model x compile x fit combination
SELECT load_model_selection_table('cat_arch', 'cat_list', ARRAY[1, 2],
    ARRAY[$$loss='categorical_crossentropy', optimizer='Adam(lr=0.01)', metrics=['accuracy']$$],
    ARRAY['batch_size=8, epochs=1', 'batch_size=16, epochs=2']);
SELECT mst_key, model_id, compile_params, fit_params FROM cat_list ORDER BY mst_key;
-- it must not exist; an unknown fit parameter; an unknown loss
SELECT load_model_selection_table('cat_arch', 'cat_list', ARRAY[1], ARRAY[$$loss='mse'$$], ARRAY['epochs=1']);
SELECT load_model_selection_table('cat_arch', 'cat_list2', ARRAY[1], ARRAY[$$loss='mse'$$], ARRAY['epoch=1']);
SELECT load_model_selection_table('cat_arch', 'cat_list2', ARRAY[1], ARRAY[$$loss='no_such_loss'$$], ARRAY['epochs=1']);
-- delete_keras_model: an unknown id, then both models (the empty table goes)
SELECT delete_keras_model('cat_arch', 7);
SELECT delete_keras_model('cat_arch', 2);
SELECT delete_keras_model('cat_arch', 1);
SELECT to_regclass('cat_arch') AS arch_table_left;
-- hyperband_schedule: MADlib's example (R=81, eta=3)
SELECT hyperband_schedule('cat_hb', 81, 3, 0);
SELECT * FROM cat_hb ORDER BY s DESC, i;
SELECT hyperband_schedule('cat_hb2', 9, 1);
SELECT hyperband_schedule('cat_hb', 9);
-- the converters: MADlib's bytes of float32 and int16 arrays, both ways
SELECT convert_bytea_to_real_array(convert_array_to_bytea(ARRAY[1.5, -2, 0.25]::real[])) AS reals,
       convert_bytea_to_smallint_array(convert_array_to_bytea(ARRAY[1, 0, -3]::smallint[])) AS smallints;
-- float4_pack: a header (int32 ndim, int32 dims[ndim]) and the float32 values of every row
SELECT int4_unpack(substring(p FROM 1 FOR 8)) AS header, float4_unpack(substring(p FROM 9)) AS values
FROM (SELECT float4_pack(x) AS p FROM (VALUES (ARRAY[1, 2]::real[]), (ARRAY[3, 4.5]::real[])) AS t(x)) AS packed;
SELECT float4_pack(x) FROM (VALUES (ARRAY[1, 2]::real[]), (ARRAY[3, 'NaN']::real[])) AS t(x);
-- bytes that are no pickle are refused without running them; GPUs are refused
SELECT load_custom_function('cat_objects', '\x00'::bytea, 'fn');
SELECT gpu_configuration('cat_gpu');
-- written_in_transaction: what the open-transaction check of the inputs asks
CREATE TABLE cat_rows (x int);
INSERT INTO cat_rows VALUES (1);
SELECT written_in_transaction('cat_rows') AS committed_insert;
BEGIN;
INSERT INTO cat_rows VALUES (2);
SELECT written_in_transaction('cat_rows') AS open_insert;
ROLLBACK;
DROP TABLE cat_rows, cat_mst, cat_mst_summary, cat_list, cat_list_summary, cat_hb;
