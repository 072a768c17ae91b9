-- Bad input gets a clear error with a HINT, and leaves nothing behind.
\set SHOW_CONTEXT never
SET search_path = public, madlib_mop;
CREATE TABLE regress_points (id integer, x real[], label text);
INSERT INTO regress_points SELECT i, ARRAY[i, i % 3]::real[], (i % 3)::text FROM generate_series(1, 30) i;
-- a table that does not exist
SELECT training_preprocessor_dl('no_such_table', 'p', 'label', 'x');
-- a column that does not exist
SELECT training_preprocessor_dl('regress_points', 'p', 'no_such_column', 'x');
-- a parameter that is not a number of segments
SELECT training_preprocessor_dl('regress_points', 'p', 'label', 'x', NULL, 255, NULL, 'seven');
-- a Lambda layer is code, refused
SELECT load_keras_model('regress_arch',
    '{"class_name": "Sequential", "config": {"layers": [{"class_name": "Lambda", "config": {"function": "x"}}]}}');
SELECT load_keras_model('regress_arch',
    '{"class_name": "Sequential", "config": {"name": "two", "layers": [{"class_name": "Dense", "config": {"units": 2, "batch_input_shape": [null, 2]}}]}}');
-- Python code is not a parameter
SELECT load_model_selection_table('regress_arch', 'm', ARRAY[1],
    ARRAY[$$loss=__import__('os').system('id')$$], ARRAY['epochs=1']);
SELECT load_model_selection_table('regress_arch', 'm', ARRAY[1],
    ARRAY[$$loss='mse', optimizer='Adam(lr=-1)'$$], ARRAY['epochs=1']);
-- an architecture table that is not one
SELECT generate_model_configs('regress_points', 'mst', ARRAY[1], $${'loss': ['mse']}$$, $${'epochs': [1]}$$);
-- a fit over a table that was not packed
SELECT madlib_keras_fit_multiple_model('regress_points', 'out', 'mst', 1);
-- segment servers: postgres_fdw missing, a server that is not registered; none registered
SELECT add_segment_server('seg1', 'localhost', 5432);
SELECT drop_segment_server('seg1');
SELECT add_segment_server('seg1', 'localhost', 5432, NULL, 0);
SELECT * FROM check_segment_servers();
-- nothing was created by the calls above
SELECT count(*) AS tables_left FROM pg_class
WHERE relname IN ('p', 'p_summary', 'm', 'm_summary', 'mst', 'mst_summary', 'out', 'out_summary', 'out_info');
SELECT count(*) AS jobs FROM jobs;
DROP TABLE regress_points, regress_arch;
