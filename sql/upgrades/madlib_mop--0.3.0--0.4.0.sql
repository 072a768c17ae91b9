-- madlib_mop 0.3.0 -> 0.4.0
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.4.0'" to load this file. \quit

-- Jobs whose models stop early or join late: how many are training, waiting, stopped and
-- finished (sql/30_fit.sql); the coordinator updates the plan's size and the model count.
ALTER TABLE @extschema@.jobs
    ADD COLUMN models_training integer NOT NULL DEFAULT 0,
    ADD COLUMN models_waiting  integer NOT NULL DEFAULT 0,
    ADD COLUMN models_stopped  integer NOT NULL DEFAULT 0,
    ADD COLUMN models_finished integer NOT NULL DEFAULT 0;
GRANT UPDATE (subepochs_total, num_models, models_training, models_waiting, models_stopped,
              models_finished) ON @extschema@.jobs TO PUBLIC;

DROP VIEW @extschema@.job_progress;
CREATE VIEW @extschema@.job_progress WITH (security_barrier, security_invoker) AS
SELECT job_id, owner,
       -- A running job whose coordinator's session has ended is waiting for resume().
       CASE WHEN state = 'running' AND NOT EXISTS (
                SELECT 1 FROM pg_catalog.pg_stat_activity a WHERE a.pid = coordinator_pid)
            THEN 'interrupted' ELSE state END AS state,
       model_output_table,
       num_models AS models, models_training, models_waiting, models_stopped, models_finished,
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
       last_error
FROM @extschema@.jobs;
COMMENT ON VIEW @extschema@.job_progress IS 'Progress of your model selection jobs, readable from any session';
GRANT SELECT ON @extschema@.job_progress TO PUBLIC;

-- fit_multiple takes a pruner (a new last parameter): the old signatures go.
DROP PROCEDURE @extschema@.fit_multiple(varchar, varchar, varchar, integer, boolean, varchar,
                                        integer, boolean, varchar, varchar, boolean, integer);
DROP FUNCTION @extschema@.madlib_keras_fit_multiple_model(varchar, varchar, varchar, integer,
                                                          boolean, varchar, integer, boolean,
                                                          varchar, varchar, boolean, integer);

-- @routines
