-- madlib_mop 0.10.0 -> 0.11.0
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.11.0'" to load this file. \quit

-- MADlib's custom functions are built (sql/55_custom_functions.sql) instead of refused: the
-- refusing three-argument load_custom_function goes (the new one's description has a
-- default), and, after this version's routines, the refusals' comments.
DROP FUNCTION IF EXISTS @extschema@.load_custom_function(varchar, bytea, text);
-- @routines
-- The worker sessions holding slots, the server's where the library is preloaded.
-- @object worker_sessions
COMMENT ON FUNCTION @extschema@.load_custom_function(varchar, bytea, text, text) IS NULL;
COMMENT ON FUNCTION @extschema@.delete_custom_function(varchar, integer) IS NULL;
COMMENT ON FUNCTION @extschema@.delete_custom_function(varchar, text) IS NULL;
COMMENT ON FUNCTION @extschema@.load_top_k_accuracy_function(varchar, integer) IS NULL;
