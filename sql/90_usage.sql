-- Usage texts: each function called with no argument, 'help', 'usage' or '?' (as in MADlib).

CREATE FUNCTION @extschema@.usage(function_name text, message text DEFAULT '')
RETURNS text
LANGUAGE plpython3u IMMUTABLE
SET jit = off
AS $python$
#include "usage.py"
$python$;
COMMENT ON FUNCTION @extschema@.usage IS
    'The usage text of one of the extension''s functions, as f(''help'') returns it';

-- f(message varchar DEFAULT '') for each function with a usage text.  (A DO $routines$
-- block is part of an upgrade's generated routines: it must be rerunnable.)
DO $routines$
DECLARE
    function_name text;
BEGIN
    FOREACH function_name IN ARRAY ARRAY[
        'training_preprocessor_dl', 'validation_preprocessor_dl', 'preprocessor_dl_append',
        'load_keras_model',
        'delete_keras_model', 'generate_model_configs', 'load_model_selection_table',
        'madlib_keras_fit_multiple_model', 'madlib_keras_fit', 'madlib_keras_evaluate',
        'madlib_keras_predict', 'madlib_keras_predict_byom', 'madlib_keras_automl',
        'hyperband_schedule', 'load_custom_function', 'delete_custom_function',
        'load_top_k_accuracy_function']
    LOOP
        EXECUTE format(
            'CREATE OR REPLACE FUNCTION %I.%I(message varchar DEFAULT %L) RETURNS varchar '
            'LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS %L',
            '@extschema@', function_name, '',
            format('SELECT %I.usage(%L, message)', '@extschema@', function_name));
    END LOOP;
END
$routines$;
