-- madlib_mop 0.14.0 -> 0.15.0
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.15.0'" to load this file. \quit

-- Several models predict over one table in one pass (madlib_keras_predict_multiple_model
-- is new): it comes with the routines of the latest update.
