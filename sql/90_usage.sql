-- Usage texts: each function called with no argument, 'help', 'usage' or '?' (as in MADlib).

CREATE FUNCTION @extschema@.usage(function_name text, message text DEFAULT '')
RETURNS text
LANGUAGE plpython3u IMMUTABLE
AS $python$
#include "usage.py"
$python$;

CREATE FUNCTION @extschema@.training_preprocessor_dl(message varchar DEFAULT '')
RETURNS varchar LANGUAGE sql IMMUTABLE
AS $$ SELECT @extschema@.usage('training_preprocessor_dl', message) $$;

CREATE FUNCTION @extschema@.validation_preprocessor_dl(message varchar DEFAULT '')
RETURNS varchar LANGUAGE sql IMMUTABLE
AS $$ SELECT @extschema@.usage('validation_preprocessor_dl', message) $$;

CREATE FUNCTION @extschema@.load_keras_model(message varchar DEFAULT '')
RETURNS varchar LANGUAGE sql IMMUTABLE
AS $$ SELECT @extschema@.usage('load_keras_model', message) $$;

CREATE FUNCTION @extschema@.delete_keras_model(message varchar DEFAULT '')
RETURNS varchar LANGUAGE sql IMMUTABLE
AS $$ SELECT @extschema@.usage('delete_keras_model', message) $$;

CREATE FUNCTION @extschema@.generate_model_configs(message varchar DEFAULT '')
RETURNS varchar LANGUAGE sql IMMUTABLE
AS $$ SELECT @extschema@.usage('generate_model_configs', message) $$;

CREATE FUNCTION @extschema@.load_model_selection_table(message varchar DEFAULT '')
RETURNS varchar LANGUAGE sql IMMUTABLE
AS $$ SELECT @extschema@.usage('load_model_selection_table', message) $$;
