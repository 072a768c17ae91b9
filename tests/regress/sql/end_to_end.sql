-- A tiny model selection: pack, load a model, generate configurations, fit with
-- validation, evaluate, predict.  Timings and losses vary with the machine: the checks
-- are on what must hold.
\set SHOW_CONTEXT never
SET search_path = public, madlib_mop;
SET client_min_messages = warning;
CREATE TABLE regress_flowers (id integer, features real[], species text);
INSERT INTO regress_flowers
SELECT i, ARRAY[(i % 3) + (i % 7) / 10.0, (i % 3) * 2 - (i % 5) / 10.0, (i % 3) + 0.5, (i % 11) / 10.0]::real[],
       (ARRAY['setosa', 'versicolor', 'virginica'])[i % 3 + 1]
FROM generate_series(1, 90) i;
SELECT training_preprocessor_dl('regress_flowers', 'regress_train', 'species', 'features',
                                NULL, 1, NULL, '2');
SELECT validation_preprocessor_dl('regress_flowers', 'regress_valid', 'species', 'features',
                                  'regress_train', NULL, '2');
SELECT load_keras_model('regress_arch',
    '{"class_name": "Sequential", "config": {"name": "tiny", "layers": [
        {"class_name": "Dense", "config": {"units": 8, "activation": "relu", "batch_input_shape": [null, 4]}},
        {"class_name": "Dense", "config": {"units": 3, "activation": "softmax"}}]}}');
SELECT generate_model_configs('regress_arch', 'regress_mst', ARRAY[1],
    $${'loss': ['categorical_crossentropy'], 'optimizer_params_list': [{'optimizer': ['Adam'], 'lr': [0.01, 0.05]}], 'metrics': ['accuracy']}$$,
    $${'batch_size': [8], 'epochs': [1]}$$);
SELECT mst_key, compile_params, fit_params FROM regress_mst ORDER BY mst_key;
SELECT madlib_keras_fit_multiple_model('regress_train', 'regress_model', 'regress_mst', 3,
                                       FALSE, 'regress_valid', 1);
SELECT mst_key, metrics_iters, array_length(training_loss, 1) AS losses,
       validation_metrics_final BETWEEN 0 AND 1 AS accuracy_in_range,
       training_loss[3] < training_loss[1] AS loss_went_down, subepochs_done
FROM regress_model_info ORDER BY mst_key;
SELECT state, models, segments, epochs_done FROM job_progress;
SELECT num_iterations, metrics_compute_frequency, num_classes, species_class_values
FROM regress_model_summary;
SELECT madlib_keras_evaluate('regress_model', 'regress_valid', 'regress_eval', FALSE, 2);
SELECT loss > 0 AS has_loss, metric BETWEEN 0 AND 1 AS accuracy_in_range, metrics_type, loss_type
FROM regress_eval;
SELECT madlib_keras_predict('regress_model', 'regress_flowers', 'id', 'features', 'regress_pred',
                            'response', FALSE, 2);
SELECT count(*) AS predictions, count(DISTINCT id) AS ids,
       bool_and(class_value IN ('setosa', 'versicolor', 'virginica')) AS known_classes
FROM regress_pred;
