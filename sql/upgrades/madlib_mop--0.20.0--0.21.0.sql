-- madlib_mop 0.20.0 -> 0.21.0
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.21.0'" to load this file. \quit

-- Fused groups train and validate on segment servers: _mop_segment_train_fused,
-- _mop_segment_validate_fused and _mop_segment_states (a fused call's states from one
-- server in one request) come with this version's routines.
-- @routines
-- 0.11.0's update cleared the comments the refusing custom-function routines of 0.10.0
-- had; they run here, after the routines exist (an update from 0.10.0 or earlier creates
-- them only here: the routines are in the latest update script alone).
COMMENT ON FUNCTION @extschema@.delete_custom_function(varchar, integer) IS NULL;
COMMENT ON FUNCTION @extschema@.delete_custom_function(varchar, text) IS NULL;
COMMENT ON FUNCTION @extschema@.load_top_k_accuracy_function(varchar, integer) IS NULL;
