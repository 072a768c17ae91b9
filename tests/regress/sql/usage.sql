-- The SQL surface: installing, the version, and the usage texts (MADlib's help forms).
CREATE SCHEMA madlib_mop;
CREATE EXTENSION madlib_mop SCHEMA madlib_mop;
SELECT extversion FROM pg_extension WHERE extname = 'madlib_mop';
SELECT split_part(madlib_mop.version(), ',', 1) AS version;
-- every help form answers; the first line says what the function does
SELECT f, split_part(btrim(t, E'\n'), E'\n', 1) AS first_line
FROM (VALUES ('training_preprocessor_dl', madlib_mop.training_preprocessor_dl()),
             ('validation_preprocessor_dl', madlib_mop.validation_preprocessor_dl('help')),
             ('load_keras_model', madlib_mop.load_keras_model('usage')),
             ('delete_keras_model', madlib_mop.delete_keras_model('?')),
             ('generate_model_configs', madlib_mop.generate_model_configs()),
             ('load_model_selection_table', madlib_mop.load_model_selection_table()),
             ('madlib_keras_fit_multiple_model', madlib_mop.madlib_keras_fit_multiple_model()),
             ('madlib_keras_fit', madlib_mop.madlib_keras_fit('help')),
             ('madlib_keras_evaluate', madlib_mop.madlib_keras_evaluate('help')),
             ('madlib_keras_predict', madlib_mop.madlib_keras_predict()),
             ('madlib_keras_predict_byom', madlib_mop.madlib_keras_predict_byom('usage')),
             ('madlib_keras_automl', madlib_mop.madlib_keras_automl()),
             ('hyperband_schedule', madlib_mop.hyperband_schedule('help'))) AS u(f, t)
ORDER BY f;
-- the whole text of one; another word than a help word
SELECT madlib_mop.generate_model_configs('help');
SELECT madlib_mop.madlib_keras_predict('what');
-- the catalog analysts read
SELECT column_name FROM information_schema.columns
WHERE table_schema = 'madlib_mop' AND table_name = 'job_progress' ORDER BY ordinal_position;
