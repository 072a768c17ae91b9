-- madlib_mop 0.8.0 -> 0.9.0
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.9.0'" to load this file. \quit

-- @routines

-- After the search (sql/60_after_search.sql): the views over each job's history are new.
-- @object intermediate_values
-- @object optimization_history
