-- madlib_mop 0.21.0 -> 0.21.1
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.21.1'" to load this file. \quit

-- No routine's signature changed: this version's routines replace 0.21.0's (a fused loop
-- that gathers each model's minibatch inside the traced loop; `auto` fusing more classes).
-- @routines
-- 0.11.0's update cleared the comments the refusing custom-function routines of 0.10.0
-- had; they run here, after the routines exist (an update from 0.10.0 or earlier creates
-- them only here: the routines are in the latest update script alone).
COMMENT ON FUNCTION @extschema@.delete_custom_function(varchar, integer) IS NULL;
COMMENT ON FUNCTION @extschema@.delete_custom_function(varchar, text) IS NULL;
COMMENT ON FUNCTION @extschema@.load_top_k_accuracy_function(varchar, integer) IS NULL;
