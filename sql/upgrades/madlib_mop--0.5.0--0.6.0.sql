-- madlib_mop 0.5.0 -> 0.6.0
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.6.0'" to load this file. \quit

-- training_preprocessor_dl takes regression (a new last parameter) and predict_byom
-- dependent_count: the old signatures go.  (IF EXISTS: a chain of updates creates every
-- routine of this version at its first step.)
DROP FUNCTION IF EXISTS @extschema@.training_preprocessor_dl(varchar, varchar, varchar, varchar,
                                                             integer, double precision, integer[],
                                                             text, integer);
DROP FUNCTION IF EXISTS @extschema@.madlib_keras_predict_byom(varchar, integer, varchar, varchar,
                                                              varchar, varchar, varchar, boolean,
                                                              text[], double precision);

-- @routines
