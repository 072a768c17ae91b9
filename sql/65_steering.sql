-- Steering a running job from SQL: stop a model, clone one into a new configuration from its
-- current state, add a configuration, change a model's iterations (madlib_mop.api.steering
-- records a request; the job's coordinator applies it at the model's next iteration boundary
-- and records where: madlib_mop.job.steering).

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
-- Only a job's owner steers it: a row names a job of the role's (jobs' row-level security
-- shows a role its own jobs only), and each role sees its own rows.
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

CREATE FUNCTION @extschema@.stop_model(job_id bigint, mst_key integer)
RETURNS bigint
#plpython "stop_model.py"
COMMENT ON FUNCTION @extschema@.stop_model IS
    'Steering: a model of your running job trains no further than its current iteration; returns the request''s action_id';

CREATE FUNCTION @extschema@.clone_model(
    job_id         bigint,
    mst_key        integer,
    compile_params varchar DEFAULT NULL,   -- NULL: the source's
    fit_params     varchar DEFAULT NULL    -- NULL: the source's
)
RETURNS bigint
#plpython "clone_model.py"
COMMENT ON FUNCTION @extschema@.clone_model IS
    'Steering: a new model of your running job, from a model''s state at its next iteration boundary, with other compile or fit parameters; returns the request''s action_id';

CREATE FUNCTION @extschema@.add_model_config(
    job_id         bigint,
    model_id       integer,
    compile_params varchar,
    fit_params     varchar
)
RETURNS bigint
#plpython "add_model_config.py"
COMMENT ON FUNCTION @extschema@.add_model_config IS
    'Steering: a new configuration of the job''s architecture table joins your running job; returns the request''s action_id';

CREATE FUNCTION @extschema@.set_model_iterations(job_id bigint, mst_key integer, num_iterations integer)
RETURNS bigint
#plpython "set_model_iterations.py"
COMMENT ON FUNCTION @extschema@.set_model_iterations IS
    'Steering: a model of your running job trains this many iterations in all; returns the request''s action_id';
