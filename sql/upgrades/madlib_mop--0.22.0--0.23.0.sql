-- madlib_mop 0.22.0 -> 0.23.0
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.23.0'" to load this file. \quit

-- No routine's signature changed: this version's routines replace 0.22.0's (jobs train
-- their fused groups in traced loops: the XLA-compiled ones corrupted the heap of the
-- server's processes).
-- @routines
-- 0.11.0's update cleared the comments the refusing custom-function routines of 0.10.0
-- had; they run here, after the routines exist (an update from 0.10.0 or earlier creates
-- them only here: the routines are in the latest update script alone).
COMMENT ON FUNCTION @extschema@.delete_custom_function(varchar, integer) IS NULL;
COMMENT ON FUNCTION @extschema@.delete_custom_function(varchar, text) IS NULL;
COMMENT ON FUNCTION @extschema@.load_top_k_accuracy_function(varchar, integer) IS NULL;
