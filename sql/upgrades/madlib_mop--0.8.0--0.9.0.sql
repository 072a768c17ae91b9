-- madlib_mop 0.8.0 -> 0.9.0
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.9.0'" to load this file. \quit

-- @routines

-- After the search (sql/60_after_search.sql): the views over each job's history are new.
-- The views read these (this script runs before a later version's routines).
CREATE FUNCTION @extschema@._mop_intermediate_values(job_id bigint)
RETURNS TABLE (mst_key integer, iteration integer, elapsed_seconds double precision,
               objective text, value double precision, metric text,
               training_loss double precision, training_metric double precision,
               validation_loss double precision, validation_metric double precision,
               status text, pruned boolean)
#plpython "mop_intermediate_values.py"

CREATE FUNCTION @extschema@._mop_optimization_history(job_id bigint)
RETURNS TABLE (report integer, elapsed_seconds double precision, mst_key integer,
               iteration integer, objective text, value double precision,
               best_value double precision, best_mst_key integer,
               best_value_by_iteration double precision)
#plpython "mop_optimization_history.py"

-- intermediate_values (as of 0.9.0)
CREATE VIEW @extschema@.intermediate_values WITH (security_invoker) AS
SELECT j.job_id, j.model_output_table, v.*
FROM @extschema@.jobs j CROSS JOIN LATERAL @extschema@._mop_intermediate_values(j.job_id) v;
COMMENT ON VIEW @extschema@.intermediate_values IS
    'Each model''s metrics at each computed iteration of your jobs; pruned marks where a pruner stopped it';
GRANT SELECT ON @extschema@.intermediate_values TO PUBLIC;

-- optimization_history (as of 0.9.0)
CREATE VIEW @extschema@.optimization_history WITH (security_invoker) AS
SELECT j.job_id, j.model_output_table, h.*
FROM @extschema@.jobs j CROSS JOIN LATERAL @extschema@._mop_optimization_history(j.job_id) h;
COMMENT ON VIEW @extschema@.optimization_history IS
    'The best value of each job''s objective so far, against time and against iterations';
GRANT SELECT ON @extschema@.optimization_history TO PUBLIC;

-- Steering running jobs (sql/65_steering.sql) is new.
-- steering (as of 0.9.0)
CREATE TABLE @extschema@.steering (
    action_id         bigserial PRIMARY KEY,
    job_id            bigint NOT NULL REFERENCES @extschema@.jobs ON DELETE CASCADE,
    owner             name NOT NULL DEFAULT current_user,
    action            text NOT NULL CHECK (action IN ('stop', 'clone', 'add', 'iterations')),
    mst_key           integer,          -- the model acted on (the source of a clone)
    params            jsonb NOT NULL DEFAULT '{}',  -- model_id, compile_params, fit_params, num_iterations
    requested_at      timestamptz NOT NULL DEFAULT now(),
    -- Set by the coordinator when it applies the request; a resumed job applies it again there.
    applied_at        timestamptz,
    applied_iteration integer,          -- the model's iteration it took effect after
    new_mst_key       integer,          -- the model a clone or an add made
    outcome           text              -- what happened, or why nothing could
);
COMMENT ON TABLE @extschema@.steering IS 'Requests to steer running jobs, and where each job applied them';
CREATE INDEX steering_of_job ON @extschema@.steering (job_id, action_id);
ALTER TABLE @extschema@.steering ENABLE ROW LEVEL SECURITY;
CREATE POLICY steering_of_the_jobs_owner ON @extschema@.steering
    USING (owner = current_user)
    WITH CHECK (owner = current_user AND EXISTS (
        SELECT 1 FROM @extschema@.jobs j WHERE j.job_id = steering.job_id AND j.owner = current_user));
GRANT SELECT ON @extschema@.steering TO PUBLIC;
GRANT INSERT (job_id, action, mst_key, params) ON @extschema@.steering TO PUBLIC;
GRANT UPDATE (applied_at, applied_iteration, new_mst_key, outcome) ON @extschema@.steering TO PUBLIC;
GRANT USAGE ON SEQUENCE @extschema@.steering_action_id_seq TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('@extschema@.steering', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.steering_action_id_seq', '');
