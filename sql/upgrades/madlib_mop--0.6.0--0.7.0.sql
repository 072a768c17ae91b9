-- madlib_mop 0.6.0 -> 0.7.0
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.7.0'" to load this file. \quit

-- written_in_transaction(regclass) is new (the open-transaction check of the inputs).

-- @routines
