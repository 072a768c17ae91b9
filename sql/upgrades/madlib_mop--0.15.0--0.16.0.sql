-- madlib_mop 0.15.0 -> 0.16.0
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.16.0'" to load this file. \quit

-- The models of a fused call evaluate their validation together (_mop_evaluate_fused is
-- new): it comes with the routines of the latest update.
