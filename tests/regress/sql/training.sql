-- Training calls beyond fit_multiple: madlib_keras_fit (one model), CALL fit_multiple,
-- resume, predict_byom, evaluate of every model, madlib_keras_automl; and their errors.
-- Losses and timings vary with the machine: the checks are on what must hold.
\set SHOW_CONTEXT never
SET search_path = public, madlib_mop;
SET client_min_messages = warning;
CREATE TABLE tr_points (id integer, x real[], label text);
INSERT INTO tr_points SELECT i, ARRAY[(i % 3) + (i % 7) / 10.0, (i % 3) * 2 - (i % 5) / 10.0]::real[],
                             (ARRAY['a', 'b', 'c'])[i % 3 + 1]
FROM generate_series(1, 60) i;
SELECT training_preprocessor_dl('tr_points', 'tr_packed', 'label', 'x', NULL, 1, NULL, '2');
SELECT load_keras_model('tr_arch',
    '{"class_name": "Sequential", "config": {"name": "mlp", "layers": [
        {"class_name": "Dense", "config": {"units": 6, "activation": "relu", "batch_input_shape": [null, 2]}},
        {"class_name": "Dense", "config": {"units": 3, "activation": "softmax"}}]}}');
-- madlib_keras_fit: one model, MADlib's single-model summary
SELECT madlib_keras_fit('tr_packed', 'tr_single', 'tr_arch', 1,
    $$loss='categorical_crossentropy', optimizer='Adam(lr=0.05)', metrics=['accuracy']$$,
    $$batch_size=8$$, 2);
SELECT model_id, num_iterations, array_length(training_loss, 1) AS losses, metrics_type, label_class_values
FROM tr_single_summary;
-- an unknown model id; a model whose output does not fit the classes
SELECT madlib_keras_fit('tr_packed', 'tr_bad', 'tr_arch', 5, $$loss='mse'$$, $$batch_size=8$$, 1);
SELECT load_keras_model('tr_arch',
    '{"class_name": "Sequential", "config": {"name": "two", "layers": [
        {"class_name": "Dense", "config": {"units": 2, "activation": "softmax", "batch_input_shape": [null, 2]}}]}}');
SELECT madlib_keras_fit('tr_packed', 'tr_bad', 'tr_arch', 2,
    $$loss='categorical_crossentropy', optimizer='Adam'$$, $$batch_size=8$$, 1);
SELECT to_regclass('tr_bad') AS nothing_left;
-- CALL fit_multiple commits as it goes; the same job again is finished
SELECT load_model_selection_table('tr_arch', 'tr_mst', ARRAY[1],
    ARRAY[$$loss='categorical_crossentropy', optimizer='Adam(lr=0.05)', metrics=['accuracy']$$,
          $$loss='categorical_crossentropy', optimizer='SGD(lr=0.1)', metrics=['accuracy']$$],
    ARRAY['batch_size=8']);
CALL fit_multiple('tr_packed', 'tr_multi', 'tr_mst', 2);
SELECT state, models, epochs_done, epochs_total FROM job_progress WHERE model_output_table = 'public.tr_multi';
SET client_min_messages = notice;
SELECT job_id AS tr_job FROM jobs WHERE model_output_table = 'public.tr_multi' \gset
CALL resume(:tr_job);
CALL resume(424242);
SET client_min_messages = warning;
-- evaluate every model of a job; predict with an architecture and weights (BYOM)
SELECT madlib_keras_evaluate_multiple_model('tr_multi', 'tr_packed', 'tr_eval_all');
SELECT mst_key, loss > 0 AS has_loss, metric BETWEEN 0 AND 1 AS accuracy_in_range FROM tr_eval_all ORDER BY mst_key;
UPDATE tr_arch SET model_weights = (SELECT model_weights FROM tr_multi WHERE mst_key = 1) WHERE model_id = 1;
SELECT madlib_keras_predict_byom('tr_arch', 1, 'tr_points', 'id', 'x', 'tr_byom', 'response',
                                 NULL, ARRAY['a', 'b', 'c']);
SELECT count(*) AS rows, bool_and(class_value IN ('a', 'b', 'c')) AS known_classes FROM tr_byom;
SELECT madlib_keras_predict_byom('tr_arch', 1, 'tr_points', 'id', 'x', 'tr_byom2', 'response',
                                 NULL, ARRAY['a', 'b']);
SELECT madlib_keras_predict('tr_multi', 'tr_points', 'id', 'x', 'tr_pred2', 'everything', FALSE, 1);
-- madlib_keras_automl: Hyperband's brackets as one hopping job; the best model is kept
SELECT madlib_keras_automl('tr_packed', 'tr_automl', 'tr_arch', 'tr_automl_mst', ARRAY[1],
    $${'loss': ['categorical_crossentropy'], 'optimizer_params_list': [{'optimizer': ['Adam'], 'lr': [0.001, 0.1, 'log']}], 'metrics': ['accuracy']}$$,
    $${'batch_size': [8], 'epochs': [1]}$$, 'hyperband', 'R=3, eta=3, skip_last=0', 1);
SELECT count(*) AS models, count(*) FILTER (WHERE stop_reason IS NOT NULL) > 0 AS some_stopped
FROM tr_automl_info;
SELECT count(*) AS kept FROM tr_automl_mst;
SELECT madlib_keras_automl('tr_packed', 'tr_automl2', 'tr_arch', 'tr_automl_mst2', ARRAY[1],
    $${'loss': ['mse']}$$, $${'epochs': [1]}$$, 'grid');
SELECT madlib_keras_automl('tr_packed', 'tr_automl2', 'tr_arch', 'tr_automl_mst2', ARRAY[1],
    $${'loss': ['mse']}$$, $${'epochs': [1]}$$, 'hyperband', 'R=3, eta=1');
