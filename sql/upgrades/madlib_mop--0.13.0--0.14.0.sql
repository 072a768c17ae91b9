-- madlib_mop 0.13.0 -> 0.14.0
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.14.0'" to load this file. \quit

-- Fused groups of models train in one call (_mop_train_fused is new): it comes with the
-- routines of the latest update.
