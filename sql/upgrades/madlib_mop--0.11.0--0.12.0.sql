-- madlib_mop 0.11.0 -> 0.12.0
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.12.0'" to load this file. \quit

-- The calling session asks a worker session what it needs of Keras (_mop_model_facts,
-- _mop_initial_states are new): they come with this version's routines.
COMMENT ON TABLE @extschema@.coordinator_id IS
    'This server''s identity as a coordinator, written on the tables it makes on segment servers';
-- @routines
-- (What ran here after the routines runs after them in the latest update script.)
