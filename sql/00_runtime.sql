-- The runtime: what version is installed, and does the in-database Python work?

CREATE FUNCTION @extschema@.version()
RETURNS text
#plpython "version.py"

COMMENT ON FUNCTION @extschema@.version() IS
    'madlib_mop, PostgreSQL, Python, TensorFlow, Keras and NumPy versions of the in-database runtime';

CREATE FUNCTION @extschema@.runtime_check(
    source_table text,
    dependent_varname text,
    independent_varname text,
    epochs integer DEFAULT 10,
    seed integer DEFAULT 0
)
RETURNS jsonb
#plpython "runtime_check.py"

COMMENT ON FUNCTION @extschema@.runtime_check(text, text, text, integer, integer) IS
    'Installation check: reads source_table inside the server and trains a small Keras classifier on it';
