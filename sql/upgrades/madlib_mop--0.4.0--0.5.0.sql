-- madlib_mop 0.4.0 -> 0.5.0
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.5.0'" to load this file. \quit

-- fit_multiple takes if_output_exists (a new last parameter): the old signatures go.
-- (IF EXISTS: a chain of updates creates every routine of this version at its first step.)
DROP PROCEDURE IF EXISTS @extschema@.fit_multiple(varchar, varchar, varchar, integer, boolean, varchar,
                                        integer, boolean, varchar, varchar, boolean, integer,
                                        varchar);
DROP FUNCTION IF EXISTS @extschema@.madlib_keras_fit_multiple_model(varchar, varchar, varchar, integer,
                                                          boolean, varchar, integer, boolean,
                                                          varchar, varchar, boolean, integer,
                                                          varchar);

-- @routines
