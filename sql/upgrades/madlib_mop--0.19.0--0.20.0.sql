-- madlib_mop 0.19.0 -> 0.20.0
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.20.0'" to load this file. \quit

-- The models of a fused call each train and evaluate after their own number of sub-epochs
-- (a person's clone joins its source's group with a count of its own): _mop_train_fused
-- and _mop_evaluate_fused take steps integer[] for step integer.  The old signatures go;
-- the new ones come with this version's routines (an update from a version before they
-- existed has no old one to drop).
DROP FUNCTION IF EXISTS @extschema@._mop_train_fused(bigint, integer[], integer, integer);
DROP FUNCTION IF EXISTS @extschema@._mop_evaluate_fused(bigint, integer[], integer, integer);
