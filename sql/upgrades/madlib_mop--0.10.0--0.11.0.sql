-- madlib_mop 0.10.0 -> 0.11.0
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.11.0'" to load this file. \quit

-- MADlib's custom functions are built (sql/55_custom_functions.sql) instead of refused: the
-- refusing three-argument load_custom_function goes (the new one's description has a
-- default), and, after this version's routines, the refusals' comments.
DROP FUNCTION IF EXISTS @extschema@.load_custom_function(varchar, bytea, text);
-- @routines
-- The worker sessions holding slots, the server's where the library is preloaded.
CREATE FUNCTION @extschema@._mop_server_slots(OUT pid integer, OUT database oid, OUT role oid)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'madlib_mop_server_slots'
LANGUAGE C VOLATILE;
CREATE VIEW @extschema@.worker_sessions AS
SELECT s.pid, d.datname AS database, pg_catalog.pg_get_userbyid(s.role) AS role,
       CASE WHEN a.application_name = 'madlib_mop idle worker' THEN 'idle' ELSE 'busy' END AS state
FROM @extschema@._mop_server_slots() s
JOIN pg_catalog.pg_database d ON d.oid = s.database
LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = s.pid
UNION ALL
SELECT l.pid, pg_catalog.current_database(), a.usename,
       CASE WHEN a.application_name = 'madlib_mop idle worker' THEN 'idle' ELSE 'busy' END
FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.classid = 1297043543::oid AND l.objsubid = 2 AND l.granted
  AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database());
COMMENT ON VIEW @extschema@.worker_sessions IS 'Worker sessions holding slots of the cap, busy or idle';
GRANT SELECT ON @extschema@.worker_sessions TO PUBLIC;
