-- Model selection by model hopping: the jobs catalog, the fit functions and procedures,
-- and the segment workers' entry points.

CREATE TABLE @extschema@.jobs (
    job_id                bigserial PRIMARY KEY,
    owner                 name NOT NULL DEFAULT current_user,
    state                 text NOT NULL DEFAULT 'created'
                          CHECK (state IN ('created', 'queued', 'running', 'finished', 'failed', 'interrupted')),
    model_output_table    text NOT NULL,
    source_table          text NOT NULL,
    validation_table      text,
    model_selection_table text NOT NULL,
    arguments             jsonb NOT NULL,   -- the call's arguments: a repeat call resumes
    tables                jsonb NOT NULL,   -- output and per-job tables: {key: [schema, table]}
    num_models            integer NOT NULL,
    num_segments          integer NOT NULL,
    validation_partitions integer,
    seed                  integer NOT NULL,
    subepochs_total       integer NOT NULL,     -- as planned now: pruners and searchers change it
    subepochs_done        integer NOT NULL DEFAULT 0,
    models_training       integer NOT NULL DEFAULT 0,
    models_waiting        integer NOT NULL DEFAULT 0,  -- not started, or held for a decision
    models_stopped        integer NOT NULL DEFAULT 0,  -- stopped early by a pruner
    models_finished       integer NOT NULL DEFAULT 0,
    created_at            timestamptz NOT NULL DEFAULT now(),
    started_at            timestamptz,
    updated_at            timestamptz,
    finished_at           timestamptz,
    coordinator_pid       integer,
    last_error            text,
    -- The advisory lock its coordinator holds: random, and visible to the job's owner only
    -- (row-level security), so another role cannot take it first and block the job.
    lock_key              bigint NOT NULL DEFAULT
                          ('x' || substr(md5(gen_random_uuid()::text), 1, 16))::bit(64)::bigint,
    models_failed         integer NOT NULL DEFAULT 0,  -- diverged, or failed on every retry
    model_failures        jsonb,    -- {mst_key: what happened to it}
    workers               integer,  -- the worker sessions it trains on now
    queue_position        integer   -- while queued for worker sessions: 1 is next
);
COMMENT ON TABLE @extschema@.jobs IS 'Model selection jobs: one row per fit call; each role sees its own';

-- Each role sees and changes its own jobs only (superusers see all).
ALTER TABLE @extschema@.jobs ENABLE ROW LEVEL SECURITY;
CREATE POLICY jobs_of_their_owner ON @extschema@.jobs
    USING (owner = current_user) WITH CHECK (owner = current_user);
-- Column privileges: a role records its jobs but never chooses a job_id (the sequence's) or
-- an owner (current_user, the default).
GRANT SELECT ON @extschema@.jobs TO PUBLIC;
GRANT INSERT (model_output_table, source_table, validation_table, model_selection_table,
              arguments, tables, num_models, num_segments, validation_partitions, seed,
              subepochs_total) ON @extschema@.jobs TO PUBLIC;
GRANT UPDATE (state, subepochs_done, subepochs_total, num_models, models_training,
              models_waiting, models_stopped, models_finished, started_at, updated_at,
              finished_at, coordinator_pid, last_error, models_failed, model_failures,
              workers, queue_position) ON @extschema@.jobs TO PUBLIC;
GRANT USAGE ON SEQUENCE @extschema@.jobs_job_id_seq TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('@extschema@.jobs', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.jobs_job_id_seq', '');

-- security_invoker: the view reads jobs as the caller, so its row-level security applies (a
-- view owned by the extension's superuser owner would bypass it and show every role's jobs).
CREATE VIEW @extschema@.job_progress WITH (security_barrier, security_invoker) AS
SELECT job_id, owner,
       -- A running job whose coordinator's session has ended is waiting for resume().
       CASE WHEN state IN ('running', 'queued') AND NOT EXISTS (
                SELECT 1 FROM pg_catalog.pg_stat_activity a WHERE a.pid = coordinator_pid)
            THEN 'interrupted' ELSE state END AS state,
       model_output_table,
       num_models AS models, models_training, models_waiting, models_stopped, models_finished,
       models_failed,
       num_segments AS segments,
       round(subepochs_done::numeric / (num_segments * num_models), 2) AS epochs_done,
       round(subepochs_total::numeric / (num_segments * num_models), 2) AS epochs_total,
       subepochs_done, subepochs_total,
       round(100.0 * subepochs_done / nullif(subepochs_total, 0), 1) AS percent_done,
       started_at, updated_at, finished_at,
       CASE WHEN state = 'running' AND subepochs_done > 0
            THEN updated_at + (updated_at - started_at) * (subepochs_total - subepochs_done)
                              / subepochs_done
       END AS eta,
       last_error,
       CASE WHEN state = 'queued' THEN queue_position END AS queue_position,
       CASE WHEN state = 'running' THEN workers END AS workers,
       model_failures
FROM @extschema@.jobs;
COMMENT ON VIEW @extschema@.job_progress IS 'Progress of your model selection jobs, readable from any session';
GRANT SELECT ON @extschema@.job_progress TO PUBLIC;

CREATE FUNCTION @extschema@.madlib_keras_fit_multiple_model(
    source_table              varchar,
    model_output_table        varchar,
    model_selection_table     varchar,
    num_iterations            integer,
    use_gpus                  boolean DEFAULT FALSE,
    validation_table          varchar DEFAULT NULL,
    metrics_compute_frequency integer DEFAULT NULL,
    warm_start                boolean DEFAULT FALSE,
    name                      varchar DEFAULT NULL,
    description               varchar DEFAULT NULL,
    use_caching               boolean DEFAULT TRUE,
    seed                      integer DEFAULT 0,
    pruner                    varchar DEFAULT NULL,  -- 'median, warmup=2' | 'successive_halving, eta=3'
    if_output_exists          varchar DEFAULT 'error'  -- a finished output: 'error' | 'new_version'
)
RETURNS void
#plpython "madlib_keras_fit_multiple_model.py"

-- CALL fit_multiple(...): the same call as a procedure, which commits as the job goes.
#procedure fit_multiple FROM madlib_keras_fit_multiple_model
COMMENT ON PROCEDURE @extschema@.fit_multiple IS
    'madlib_keras_fit_multiple_model as a procedure (CALL, outside a transaction block): the job commits as it goes';

CREATE FUNCTION @extschema@.resume_job(job_id bigint)
RETURNS void
#plpython "resume_job.py"
COMMENT ON FUNCTION @extschema@.resume_job IS
    'Continues an interrupted job of yours from its last finished sub-epoch, to the same weights (CALL resume(job_id) commits as it goes)';

#procedure resume FROM resume_job
COMMENT ON PROCEDURE @extschema@.resume IS
    'CALL resume(job_id): continues an interrupted job of yours from its last finished sub-epoch, to the same weights, committing as it goes';

-- Segment workers: called by the coordinator over its worker sessions.  On the job's own
-- server model_state is NULL: the worker reads the state from the job's store and writes
-- the new one there (madlib_mop.job.state_store); a segment server's worker gets the state
-- with the call and sends the new one back (madlib_mop.engine.base).
CREATE FUNCTION @extschema@._mop_train(job_id bigint, mst_key integer, step integer,
                                       segment integer, model_state bytea,
                                       OUT new_state bytea, OUT result jsonb)
#plpython "mop_train.py"

-- Models of one fusion group (madlib_mop.fuse_models) trained as one program, each after
-- its own number of sub-epochs (steps, in the order of mst_keys: a clone's is not its
-- source's): their states read from and written to the job's store, one visit record per
-- model, in their order.
CREATE FUNCTION @extschema@._mop_train_fused(job_id bigint, mst_keys integer[], steps integer[],
                                             segment integer)
RETURNS jsonb[]
#plpython "mop_train_fused.py"

CREATE FUNCTION @extschema@._mop_evaluate(job_id bigint, mst_key integer, step integer,
                                          partition integer, model_state bytea)
RETURNS jsonb
#plpython "mop_evaluate.py"

-- The validation pass of the models of one fused call (their states in the job's store) as
-- one program, each after its own number of sub-epochs: each model's result, in their order.
CREATE FUNCTION @extschema@._mop_evaluate_fused(job_id bigint, mst_keys integer[], steps integer[],
                                                partition integer)
RETURNS jsonb[]
#plpython "mop_evaluate_fused.py"

-- Where workers reach this server: its first Unix socket folder.  Reading the setting needs
-- pg_read_all_settings, which a role running a job need not have.
CREATE FUNCTION @extschema@._server_socket_directory()
RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ SELECT trim(split_part(current_setting('unix_socket_directories'), ',', 1)) $$;

CREATE FUNCTION @extschema@.madlib_keras_fit(
    source_table              varchar,
    model                     varchar,
    model_arch_table          varchar,
    model_id                  integer,
    compile_params            varchar,
    fit_params                varchar,
    num_iterations            integer,
    use_gpus                  boolean DEFAULT FALSE,
    validation_table          varchar DEFAULT NULL,
    metrics_compute_frequency integer DEFAULT NULL,
    warm_start                boolean DEFAULT FALSE,
    name                      varchar DEFAULT NULL,
    description               varchar DEFAULT NULL,
    object_table              varchar DEFAULT NULL,
    seed                      integer DEFAULT 0
)
RETURNS void
#plpython "madlib_keras_fit.py"

CREATE FUNCTION @extschema@._mop_warm_up(segments integer)
RETURNS void
#plpython "mop_warm_up.py"

-- A session kept ready for its role traces the programs of the role's latest job
-- (madlib_mop/engine/prewarm.py): how many.
CREATE FUNCTION @extschema@._mop_trace_latest_job()
RETURNS integer
#plpython "mop_trace_latest_job.py"

-- What a call needs of its models from Keras (madlib_mop/runtime/model_facts.py), asked of a
-- worker session so that the calling session never imports TensorFlow.
CREATE FUNCTION @extschema@._mop_model_facts(request jsonb)
RETURNS jsonb
#plpython "mop_model_facts.py"

-- The models' step-0 states: into files of the request's directory (token), or returned.
CREATE FUNCTION @extschema@._mop_initial_states(request jsonb, weights bytea[], token text,
                                                OUT states bytea[], OUT sizes bigint[])
#plpython "mop_initial_states.py"

-- The piece at byte at_byte (4 MB at most) of a step-0 state _mop_initial_states wrote to
-- its request's files: a coordinator reads a segment server's this way, whatever its size.
CREATE FUNCTION @extschema@._mop_initial_state_piece(token text, mst_key integer, at_byte bigint)
RETURNS bytea
#plpython "mop_initial_state_piece.py"

-- The server's pool of worker sessions (madlib_mop/engine/server_slots.py).  Where the
-- extension's library is preloaded (shared_preload_libraries), its slots and its queue are
-- the server's, in shared memory (src/server_slots.c): one cap for every database.
CREATE FUNCTION @extschema@._mop_pool_shared()
RETURNS boolean
AS 'MODULE_PATHNAME', 'madlib_mop_pool_shared'
LANGUAGE C VOLATILE;

CREATE FUNCTION @extschema@._mop_take_server_slot(cap integer)
RETURNS integer
AS 'MODULE_PATHNAME', 'madlib_mop_take_server_slot'
LANGUAGE C VOLATILE STRICT;

CREATE FUNCTION @extschema@._mop_server_slots(OUT pid integer, OUT database oid, OUT role oid)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'madlib_mop_server_slots'
LANGUAGE C VOLATILE;

CREATE FUNCTION @extschema@._mop_queue_enter()
RETURNS bigint
AS 'MODULE_PATHNAME', 'madlib_mop_queue_enter'
LANGUAGE C VOLATILE;

CREATE FUNCTION @extschema@._mop_queue_leave(ticket bigint)
RETURNS boolean
AS 'MODULE_PATHNAME', 'madlib_mop_queue_leave'
LANGUAGE C VOLATILE STRICT;

CREATE FUNCTION @extschema@._mop_server_queue(OUT ticket bigint, OUT pid integer, OUT database oid,
                                              OUT role oid, OUT since timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'madlib_mop_server_queue'
LANGUAGE C VOLATILE;

-- A worker session takes a slot as its first statement and holds it while it lives: at
-- most madlib_mop.max_worker_sessions live at once, in the server where the library is
-- preloaded, else in this database (a session-level advisory lock of class 0x4D4F5057).
CREATE FUNCTION @extschema@._mop_take_slot(cap integer)
RETURNS integer
LANGUAGE plpgsql VOLATILE STRICT SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF @extschema@._mop_pool_shared() THEN
        RETURN @extschema@._mop_take_server_slot(cap);
    END IF;
    FOR slot IN 0 .. cap - 1 LOOP
        IF pg_try_advisory_lock(1297043543, slot) THEN
            RETURN slot;
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

-- The worker sessions holding slots: the server's (every database) where the library is
-- preloaded, else this database's; busy or idle (kept for their role's next call).
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

-- madlib_mop.max_worker_sessions as this session sees it: declared by the extension's
-- library (only a superuser may set it), which calling this loads.
CREATE FUNCTION @extschema@._mop_max_worker_sessions()
RETURNS integer
AS 'MODULE_PATHNAME', 'madlib_mop_max_worker_sessions'
LANGUAGE C STABLE;

-- The cap in force for this session's calls: madlib_mop.max_worker_sessions, or the
-- machine's when it is 0 (metrics: madlib-mop exporter).
CREATE FUNCTION @extschema@._mop_worker_cap()
RETURNS integer
#plpython "mop_worker_cap.py"

-- What a job's worker sessions may use here: the cap, each session's share of the machine's
-- memory, madlib_mop.worker_memory_mb.  A coordinator asks its segment servers before a job.
CREATE FUNCTION @extschema@._mop_worker_limits()
RETURNS jsonb
#plpython "mop_worker_limits.py"

-- Calls waiting for worker sessions: every role sees the queue (its order is fair between
-- roles), each adds and removes only its own rows; a row counts while the session that
-- wrote it (pid) lives.
CREATE TABLE @extschema@.worker_queue (
    ticket   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    role     name NOT NULL DEFAULT current_user,
    pid      integer NOT NULL DEFAULT pg_backend_pid(),
    job_id   bigint,
    since    timestamptz NOT NULL DEFAULT clock_timestamp()
);
COMMENT ON TABLE @extschema@.worker_queue IS 'Calls waiting for one of the server''s worker sessions';
ALTER TABLE @extschema@.worker_queue ENABLE ROW LEVEL SECURITY;
CREATE POLICY worker_queue_seen_by_all ON @extschema@.worker_queue FOR SELECT USING (true);
CREATE POLICY worker_queue_own_rows_added ON @extschema@.worker_queue FOR INSERT
    WITH CHECK (role = current_user AND pid = pg_backend_pid());
CREATE POLICY worker_queue_own_rows_removed ON @extschema@.worker_queue FOR DELETE
    USING (role = current_user);
GRANT SELECT, DELETE ON @extschema@.worker_queue TO PUBLIC;
GRANT INSERT (job_id) ON @extschema@.worker_queue TO PUBLIC;

-- An idle worker session's wait for its session's next job: it ends the session (and so
-- gives its slot back) when a call is queued or after `seconds`.
CREATE FUNCTION @extschema@._mop_idle_worker(seconds integer)
RETURNS void
#plpython "mop_idle_worker.py"

#procedure _mop_idle FROM _mop_idle_worker

-- Worker sessions kept ready for the roles of madlib_mop.prewarm_roles in this database
-- (madlib_mop/engine/prewarm.py): the preloaded library's background worker calls it every
-- few seconds, as the superuser (src/prewarm.c); anyone else is refused.  Sessions opened.
CREATE FUNCTION @extschema@._mop_prewarm()
RETURNS integer
#plpython "mop_prewarm.py"
