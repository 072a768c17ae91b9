-- After the search: which hyperparameters mattered, the trade-offs between objectives,
-- deployed models, and each job's history as views any BI tool reads (madlib_mop.api.analysis,
-- madlib_mop.api.deployments).

CREATE FUNCTION @extschema@.hyperparameter_importance(
    model_output_table varchar,
    objective          varchar DEFAULT NULL,   -- NULL: the job's ('validation_accuracy', 'loss min', ...)
    evaluator          varchar DEFAULT 'fanova',  -- Optuna's fANOVA, or 'ped_anova'  
    iteration          integer DEFAULT NULL    -- NULL: finished models; k: every model at iteration k
)
RETURNS TABLE (hyperparameter text, importance double precision)
#plpython "hyperparameter_importance.py"
COMMENT ON FUNCTION @extschema@.hyperparameter_importance IS
    'Which hyperparameters mattered for a job''s objective (Optuna''s fANOVA or PED-ANOVA): importances summing to 1, most important first';

CREATE FUNCTION @extschema@.pareto_front(
    model_output_table varchar,
    objectives         text[]    -- '<_info column> [max|min]', e.g. 'inference_ms_per_row min'
)
RETURNS TABLE (mst_key integer, objective_values double precision[])
#plpython "pareto_front.py"
COMMENT ON FUNCTION @extschema@.pareto_front IS
    'The models of a job that no other model beats on every objective (columns of <out>_info, each max or min)';

CREATE FUNCTION @extschema@.deploy_model(
    model_output_table varchar,
    mst_key            integer,
    name               varchar
)
RETURNS integer
#plpython "deploy_model.py"
COMMENT ON FUNCTION @extschema@.deploy_model(varchar, integer, varchar) IS
    'Deploys one model of a job under a name, as its next version (returned); madlib_keras_predict and madlib_keras_evaluate take the name as their model table';

CREATE FUNCTION @extschema@.deploy_model(
    model_output_table varchar,
    name               varchar,
    strategy           varchar DEFAULT 'best_score',   -- or 'most_recent'
    threshold          double precision DEFAULT NULL,  -- a model must be at least this good
    objective          varchar DEFAULT NULL            -- NULL: the job's
)
RETURNS integer
#plpython "deploy_model_by_strategy.py"
COMMENT ON FUNCTION @extschema@.deploy_model(varchar, varchar, varchar, double precision, varchar) IS
    'Deploys under a name the model a strategy picks (best_score or most_recent) among those at least as good as threshold; returns the version';

CREATE FUNCTION @extschema@.rollback_model(name varchar)
RETURNS integer
#plpython "rollback_model.py"
COMMENT ON FUNCTION @extschema@.rollback_model IS
    'Makes the version of a deployment before the active one active again, and returns it; nothing is deleted';

-- The views' rows, job by job: the jobs the caller sees (jobs' row-level security).
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

-- security_invoker: read as the caller, so each role sees its own jobs.
CREATE VIEW @extschema@.intermediate_values WITH (security_invoker) AS
SELECT j.job_id, j.model_output_table, v.*
FROM @extschema@.jobs j CROSS JOIN LATERAL @extschema@._mop_intermediate_values(j.job_id) v;
COMMENT ON VIEW @extschema@.intermediate_values IS
    'Each model''s metrics at each computed iteration of your jobs; pruned marks where a pruner stopped it';
GRANT SELECT ON @extschema@.intermediate_values TO PUBLIC;

CREATE VIEW @extschema@.optimization_history WITH (security_invoker) AS
SELECT j.job_id, j.model_output_table, h.*
FROM @extschema@.jobs j CROSS JOIN LATERAL @extschema@._mop_optimization_history(j.job_id) h;
COMMENT ON VIEW @extschema@.optimization_history IS
    'The best value of each job''s objective so far, against time and against iterations';
GRANT SELECT ON @extschema@.optimization_history TO PUBLIC;
