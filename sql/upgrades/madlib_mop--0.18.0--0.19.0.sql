-- madlib_mop 0.18.0 -> 0.19.0
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.19.0'" to load this file. \quit

-- States of any size on segment servers, and materialize_features where the rows are
-- (_mop_segment_receive, _mop_initial_state_piece, _mop_worker_limits and
-- _mop_segment_materialize are new): they come with this version's routines.
-- @routines
-- 0.11.0's update cleared the comments the refusing custom-function routines of 0.10.0
-- had; they run here, after the routines exist (an update from 0.10.0 or earlier creates
-- them only here: the routines are in the latest update script alone).
COMMENT ON FUNCTION @extschema@.delete_custom_function(varchar, integer) IS NULL;
COMMENT ON FUNCTION @extschema@.delete_custom_function(varchar, text) IS NULL;
COMMENT ON FUNCTION @extschema@.load_top_k_accuracy_function(varchar, integer) IS NULL;
