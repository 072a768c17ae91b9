-- madlib_mop 0.12.0 -> 0.13.0
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.13.0'" to load this file. \quit

-- The preprocessors take key_column.  Their earlier signatures go (any an earlier version
-- left: an update runs each step's routines as this version has them), so that a call of
-- their first arguments names one function; this version's come back with the routines.
DO $drop$
DECLARE
    routine regprocedure;
BEGIN
    FOR routine IN
        SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
        WHERE p.pronamespace = '@extschema@'::regnamespace
          AND p.proname IN ('training_preprocessor_dl', 'validation_preprocessor_dl')
    LOOP
        EXECUTE format('DROP FUNCTION %s', routine);
    END LOOP;
END
$drop$;
-- Model selection in cycles over a growing table (sql/68_cycles.sql).
-- @object cycles
SELECT pg_catalog.pg_extension_config_dump('@extschema@.cycles', '');
-- @object cycle_results
-- Staged features kept across jobs (sql/67_transfer.sql).
-- @object staged_features
-- @routines
-- 0.11.0's update cleared the comments the refusing custom-function routines of 0.10.0
-- had; they run here, after the routines exist (an update from 0.10.0 or earlier creates
-- them only here: the routines are in the latest update script alone).
COMMENT ON FUNCTION @extschema@.delete_custom_function(varchar, integer) IS NULL;
COMMENT ON FUNCTION @extschema@.delete_custom_function(varchar, text) IS NULL;
COMMENT ON FUNCTION @extschema@.load_top_k_accuracy_function(varchar, integer) IS NULL;
