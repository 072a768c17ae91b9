-- madlib_mop 0.7.0 -> 0.8.0
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.8.0'" to load this file. \quit

-- Jobs may wait for worker sessions ('queued'); models that diverge or fail stop alone and
-- are counted and named (sql/30_fit.sql).
ALTER TABLE @extschema@.jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE @extschema@.jobs ADD CONSTRAINT jobs_state_check
    CHECK (state IN ('created', 'queued', 'running', 'finished', 'failed', 'interrupted'));
ALTER TABLE @extschema@.jobs
    ADD COLUMN models_failed  integer NOT NULL DEFAULT 0,
    ADD COLUMN model_failures jsonb,
    ADD COLUMN workers        integer,
    ADD COLUMN queue_position integer;
GRANT UPDATE (models_failed, model_failures, workers, queue_position) ON @extschema@.jobs TO PUBLIC;

DROP VIEW @extschema@.job_progress;
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

-- The queue of the server's pool of worker sessions is new.
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

-- @routines
