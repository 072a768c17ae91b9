-- madlib_mop 0.2.0 -> 0.3.0
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.3.0'" to load this file. \quit

-- Segment servers (the several-servers engine): their registry, as sql/35_cluster.sql makes it.
CREATE TABLE @extschema@.segment_servers (
    server_name name PRIMARY KEY,       -- a postgres_fdw foreign server of this database
    segments    integer NOT NULL DEFAULT 1 CHECK (segments > 0),
    position    integer NOT NULL UNIQUE, -- registration order: the order of the segments
    added_at    timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE @extschema@.segment_servers IS
    'Registered segment servers, in segment order (add_segment_server, drop_segment_server)';
-- Everyone may read where segments are; only the extension's owner (a DBA) registers.
GRANT SELECT ON @extschema@.segment_servers TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('@extschema@.segment_servers', '');

-- This coordinator's identity, written on the tables it makes on segment servers: a packing
-- replaces a table there only if this coordinator made it.
CREATE TABLE @extschema@.coordinator_id (id uuid PRIMARY KEY DEFAULT gen_random_uuid());
INSERT INTO @extschema@.coordinator_id DEFAULT VALUES;
GRANT SELECT ON @extschema@.coordinator_id TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('@extschema@.coordinator_id', '');

-- @routines
