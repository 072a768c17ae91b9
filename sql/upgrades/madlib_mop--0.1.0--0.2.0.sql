-- madlib_mop 0.1.0 -> 0.2.0
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.2.0'" to load this file. \quit

-- Segment workers get the model's state with the call and return the new state.
DROP FUNCTION @extschema@._mop_train(bigint, integer, integer, integer);
DROP FUNCTION @extschema@._mop_evaluate(bigint, integer, integer, integer);

-- A job's tables are recorded as [schema, table] pairs instead of quoted SQL names.
UPDATE @extschema@.jobs
SET tables = (SELECT pg_catalog.jsonb_object_agg(key, pg_catalog.to_jsonb(pg_catalog.parse_ident(value)))
              FROM pg_catalog.jsonb_each_text(tables))
WHERE pg_catalog.jsonb_typeof(tables -> 'output') = 'string';

-- @routines
