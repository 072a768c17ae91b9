-- madlib_mop 0.8.0 -> 0.9.0
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.9.0'" to load this file. \quit

-- @routines

-- After the search (sql/60_after_search.sql): the views over each job's history are new.
-- @object intermediate_values
-- @object optimization_history

-- Steering running jobs (sql/65_steering.sql) is new.
-- @object steering
GRANT USAGE ON SEQUENCE @extschema@.steering_action_id_seq TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('@extschema@.steering', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.steering_action_id_seq', '');
