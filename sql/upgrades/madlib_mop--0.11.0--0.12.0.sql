-- madlib_mop 0.11.0 -> 0.12.0
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.12.0'" to load this file. \quit

-- The calling session asks a worker session what it needs of Keras (_mop_model_facts,
-- _mop_initial_states are new): they come with this version's routines.
COMMENT ON TABLE @extschema@.coordinator_id IS
    'This server''s identity as a coordinator, written on the tables it makes on segment servers';
-- @routines
-- 0.11.0's update cleared the comments the refusing custom-function routines of 0.10.0
-- had; they run here, after the routines exist (an update from 0.10.0 or earlier creates
-- them only above).
COMMENT ON FUNCTION @extschema@.delete_custom_function(varchar, integer) IS NULL;
COMMENT ON FUNCTION @extschema@.delete_custom_function(varchar, text) IS NULL;
COMMENT ON FUNCTION @extschema@.load_top_k_accuracy_function(varchar, integer) IS NULL;
