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
-- @object job_progress

-- The queue of the server's pool of worker sessions is new.
-- @object worker_queue

-- @routines
