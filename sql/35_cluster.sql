-- Segment servers: PostgreSQL servers with this extension that hold segments of packed
-- tables (madlib_mop.db.segments).  Each is a postgres_fdw foreign server; registering it
-- here makes training_preprocessor_dl spread new packed tables over it, and fits run their
-- workers on it.

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
COMMENT ON TABLE @extschema@.coordinator_id IS
    'This server''s identity as a coordinator, written on the tables it makes on segment servers';
SELECT pg_catalog.pg_extension_config_dump('@extschema@.coordinator_id', '');

CREATE FUNCTION @extschema@.add_segment_server(
    server_name text,
    host        text    DEFAULT NULL,
    port        integer DEFAULT NULL,
    dbname      text    DEFAULT NULL,
    segments    integer DEFAULT 1
)
RETURNS void
#plpython "add_segment_server.py"
COMMENT ON FUNCTION @extschema@.add_segment_server IS
    'Registers a segment server: a PostgreSQL server with this extension that holds segments of the packed tables made from then on';

CREATE FUNCTION @extschema@.drop_segment_server(server_name text)
RETURNS void
#plpython "drop_segment_server.py"
COMMENT ON FUNCTION @extschema@.drop_segment_server IS
    'Unregisters a segment server that no packed table uses';

-- Each registered server as the calling role sees it: reachable, its extension version.
CREATE FUNCTION @extschema@.check_segment_servers(
    OUT server_name text, OUT address text, OUT segments integer, OUT first_segment integer,
    OUT reachable boolean, OUT extension_version text, OUT message text)
RETURNS SETOF record
#plpython "check_segment_servers.py"
COMMENT ON FUNCTION @extschema@.check_segment_servers IS
    'Each registered segment server as the calling role sees it: reachable, its extension version';

-- A segment server's worker session gets its job's description (engine.cluster).
CREATE FUNCTION @extschema@._mop_segment_job(job jsonb)
RETURNS void
#plpython "mop_segment_job.py"

-- A coordinator's job takes up one of the calling role's idle worker sessions of this
-- segment server through a plain session here, which relays its calls (engine/relay.py):
-- the idle session listens on a socket only this server's backends reach.  Its process id,
-- NULL when there is none to take.
CREATE FUNCTION @extschema@._mop_relay_adopt(local_segments integer, label text)
RETURNS integer
#plpython "mop_relay_adopt.py"

-- One worker call relayed to the adopted session: arguments and results as its socket
-- frames them (bytes values as {"blob": i}, the blobs apart).
CREATE FUNCTION @extschema@._mop_relay_call(function_name text, arguments jsonb, blobs bytea[],
                                            OUT result jsonb, OUT result_blobs bytea[])
#plpython "mop_relay_call.py"

-- The adopted session back to idleness for this server's madlib_mop.worker_idle_seconds:
-- its process id once it listens again.
CREATE FUNCTION @extschema@._mop_relay_release()
RETURNS integer
#plpython "mop_relay_release.py"

-- madlib_keras_evaluate's part on a segment server: the models and their weights come with
-- the call.
CREATE FUNCTION @extschema@._mop_segment_evaluate(task jsonb, partition integer, weights bytea[])
RETURNS jsonb
#plpython "mop_segment_evaluate.py"

-- training_preprocessor_dl's part on a segment server for a source table whose rows lie
-- there: packs them into this server's segments.
CREATE FUNCTION @extschema@._mop_pack_segment(task jsonb)
RETURNS jsonb
#plpython "mop_pack_segment.py"

-- States that travel between segment servers (madlib_mop.segment.kept_states): a segment
-- server's worker keeps the state each visit leaves, in a file of its server; the next
-- visit's worker, on any segment server, fetches it from there directly.
-- A sub-epoch from model_state (carried by the coordinator), else from the state kept on
-- segment server state_from (NULL: this one); the new state stays here.  The visit's record.
CREATE FUNCTION @extschema@._mop_segment_train(job_id bigint, mst_key integer, step integer,
                                               segment integer, state_from text,
                                               model_state bytea, forget_below integer)
RETURNS jsonb
#plpython "mop_segment_train.py"

-- A state the coordinator carries to this server, a piece (at byte at_byte of it) per call,
-- into the role's hop file of the job: _mop_segment_train and _mop_segment_validate then
-- find it here.  The last piece puts it in place.
CREATE FUNCTION @extschema@._mop_segment_receive(job_id bigint, mst_key integer, step integer,
                                                 piece bytea, at_byte bigint, last boolean)
RETURNS void
#plpython "mop_segment_receive.py"

-- A validation pass of a state found as _mop_segment_train finds it.
CREATE FUNCTION @extschema@._mop_segment_validate(job_id bigint, mst_key integer, step integer,
                                                  partition integer, state_from text,
                                                  model_state bytea)
RETURNS jsonb
#plpython "mop_segment_validate.py"

-- One sub-epoch of the models of one fused group (madlib_mop.fuse_models) as one program:
-- each model's state found as _mop_segment_train finds it (kept on segment server
-- states_from[i], NULL: here, where the coordinator may have carried it before the call),
-- each after its own number of sub-epochs (steps); the new states stay here.  Each model's
-- visit record, in the order of mst_keys.
CREATE FUNCTION @extschema@._mop_segment_train_fused(job_id bigint, mst_keys integer[], steps integer[],
                                                     segment integer, states_from text[],
                                                     forget_below integer[])
RETURNS jsonb[]
#plpython "mop_segment_train_fused.py"

-- The validation pass of the models of one fused call, their states found as
-- _mop_segment_train_fused finds them: each model's result, in the order of mst_keys.
CREATE FUNCTION @extschema@._mop_segment_validate_fused(job_id bigint, mst_keys integer[], steps integer[],
                                                        partition integer, states_from text[])
RETURNS jsonb[]
#plpython "mop_segment_validate_fused.py"

-- Of the segment servers named as the coordinator names them, those this server's workers
-- fetch states from directly: a foreign server of that name here (a superuser's) and the
-- calling role's user mapping for it.
CREATE FUNCTION @extschema@._mop_segment_peers(server_names text[])
RETURNS text[]
#plpython "mop_segment_peers.py"

-- A state kept here, in pieces of 4 MB, for another server's session of the same role:
-- whole (the coordinator's durable copy), or as kept (a staged model's head state, without
-- its frozen layers, which _mop_segment_prefix gives once per job and digest).
CREATE FUNCTION @extschema@._mop_segment_state(store text, mst_key integer, step integer,
                                               whole boolean)
RETURNS SETOF bytea
#plpython "mop_segment_state.py"

-- States kept here, as _mop_segment_state gives each as kept, one after the other: the
-- states a fused call fetches from this server, in one request.
CREATE FUNCTION @extschema@._mop_segment_states(store text, mst_keys integer[], steps integer[])
RETURNS TABLE (mst_key integer, piece bytea)
#plpython "mop_segment_states.py"

-- The state of a staged model's frozen layers kept here, by their digest, in pieces.
CREATE FUNCTION @extschema@._mop_segment_prefix(store text, digest text)
RETURNS SETOF bytea
#plpython "mop_segment_prefix.py"

-- Does this server keep these states (a resumed job asks before it goes back)?
CREATE FUNCTION @extschema@._mop_segment_states_held(store text, mst_keys integer[],
                                                     steps integer[])
RETURNS boolean[]
#plpython "mop_segment_states_held.py"

-- The job ended: the role's states of it here go.
CREATE FUNCTION @extschema@._mop_segment_forget(store text)
RETURNS void
#plpython "mop_segment_forget.py"
