-- madlib_mop 0.1.0: generated from sql/ and udf/ by madlib_mop.extension_build
\echo Use "CREATE EXTENSION madlib_mop" to load this file. \quit

-- ==== 00_runtime.sql ====
-- The runtime: what version is installed, and does the in-database Python work?

CREATE FUNCTION @extschema@.version()
RETURNS text
LANGUAGE plpython3u VOLATILE
SET jit = off
AS $python$
# ---- madlib_mop: make the in-database runtime importable (generated) ----
import sys
if '@site_packages@' not in sys.path:
    import site
    _path_before = list(sys.path)
    site.addsitedir('@site_packages@')
    # The runtime's packages come first, ahead of any the system Python may carry.
    sys.path[:] = [p for p in sys.path if p not in _path_before] + _path_before
    del _path_before
# ---- end of preamble ----
from madlib_mop.plpy_bridge import run
from madlib_mop.runtime_check import version

return run(plpy, version)
$python$;

COMMENT ON FUNCTION @extschema@.version() IS
    'madlib_mop, PostgreSQL, Python, TensorFlow, Keras and NumPy versions of the in-database runtime';

CREATE FUNCTION @extschema@.runtime_check(
    source_table text,
    dependent_varname text,
    independent_varname text,
    epochs integer DEFAULT 10,
    seed integer DEFAULT 0
)
RETURNS jsonb
LANGUAGE plpython3u VOLATILE
SET jit = off
AS $python$
# ---- madlib_mop: make the in-database runtime importable (generated) ----
import sys
if '@site_packages@' not in sys.path:
    import site
    _path_before = list(sys.path)
    site.addsitedir('@site_packages@')
    # The runtime's packages come first, ahead of any the system Python may carry.
    sys.path[:] = [p for p in sys.path if p not in _path_before] + _path_before
    del _path_before
# ---- end of preamble ----
from madlib_mop.plpy_bridge import run
from madlib_mop.runtime_check import runtime_check

return run(plpy, runtime_check, source_table, dependent_varname, independent_varname, epochs, seed)
$python$;

COMMENT ON FUNCTION @extschema@.runtime_check(text, text, text, integer, integer) IS
    'Installation check: reads source_table inside the server and trains a small Keras classifier on it';

-- ==== 05_packing.sql ====
-- float4_pack(array): packs the arrays of a set of rows into one buffer of float32 values
-- (header: int32 ndim, int32 dims[ndim]).  Written in C (src/float4_pack.c): it is the
-- preprocessor's inner loop, one value at a time over the whole table.

CREATE FUNCTION @extschema@._float4_pack_transfn(internal, anyarray)
RETURNS internal
AS 'MODULE_PATHNAME', 'madlib_mop_float4_pack_transfn'
LANGUAGE C CALLED ON NULL INPUT;

CREATE FUNCTION @extschema@._float4_pack_finalfn(internal)
RETURNS bytea
AS 'MODULE_PATHNAME', 'madlib_mop_float4_pack_finalfn'
LANGUAGE C STRICT;

CREATE AGGREGATE @extschema@.float4_pack(anyarray) (
    SFUNC = @extschema@._float4_pack_transfn,
    STYPE = internal,
    FINALFUNC = @extschema@._float4_pack_finalfn
);

COMMENT ON AGGREGATE @extschema@.float4_pack(anyarray) IS
    'Packs same-shaped numeric arrays into float32 bytes: int32 ndim, int32 dims[], float32 values';

-- The reverse: bytes of float32 / int32 values (server byte order) as an array.
CREATE FUNCTION @extschema@.float4_unpack(bytea)
RETURNS real[]
AS 'MODULE_PATHNAME', 'madlib_mop_float4_unpack'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION @extschema@.int4_unpack(bytea)
RETURNS integer[]
AS 'MODULE_PATHNAME', 'madlib_mop_int4_unpack'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

-- ==== 10_preprocessor.sql ====
-- Data preparation: MADlib's training_preprocessor_dl and validation_preprocessor_dl.

CREATE FUNCTION @extschema@.training_preprocessor_dl(
    source_table        varchar,
    output_table        varchar,
    dependent_varname   varchar,
    independent_varname varchar,
    buffer_size         integer   DEFAULT NULL,
    normalizing_const   double precision DEFAULT 1.0,  -- MADlib: real; also takes float8 values
    num_classes         integer[] DEFAULT NULL,
    distribution_rules  text      DEFAULT NULL,
    seed                integer   DEFAULT 0
)
RETURNS void
LANGUAGE plpython3u VOLATILE
SET jit = off
AS $python$
# ---- madlib_mop: make the in-database runtime importable (generated) ----
import sys
if '@site_packages@' not in sys.path:
    import site
    _path_before = list(sys.path)
    site.addsitedir('@site_packages@')
    # The runtime's packages come first, ahead of any the system Python may carry.
    sys.path[:] = [p for p in sys.path if p not in _path_before] + _path_before
    del _path_before
# ---- end of preamble ----
from madlib_mop.plpy_bridge import run
from madlib_mop.preprocessor import training_preprocessor_dl

run(plpy, training_preprocessor_dl, source_table, output_table, dependent_varname,
    independent_varname, buffer_size, normalizing_const, num_classes, distribution_rules, seed)
$python$;

COMMENT ON FUNCTION @extschema@.training_preprocessor_dl(varchar, varchar, varchar, varchar, integer, double precision, integer[], text, integer) IS
    'Shuffles and packs a table into minibatch buffers spread over segments; SELECT training_preprocessor_dl(''help'') for usage';

CREATE FUNCTION @extschema@.validation_preprocessor_dl(
    source_table                varchar,
    output_table                varchar,
    dependent_varname           varchar,
    independent_varname         varchar,
    training_preprocessor_table varchar,
    buffer_size                 integer DEFAULT NULL,
    distribution_rules          text    DEFAULT NULL
)
RETURNS void
LANGUAGE plpython3u VOLATILE
SET jit = off
AS $python$
# ---- madlib_mop: make the in-database runtime importable (generated) ----
import sys
if '@site_packages@' not in sys.path:
    import site
    _path_before = list(sys.path)
    site.addsitedir('@site_packages@')
    # The runtime's packages come first, ahead of any the system Python may carry.
    sys.path[:] = [p for p in sys.path if p not in _path_before] + _path_before
    del _path_before
# ---- end of preamble ----
from madlib_mop.plpy_bridge import run
from madlib_mop.preprocessor import validation_preprocessor_dl

run(plpy, validation_preprocessor_dl, source_table, output_table, dependent_varname,
    independent_varname, training_preprocessor_table, buffer_size, distribution_rules)
$python$;

COMMENT ON FUNCTION @extschema@.validation_preprocessor_dl(varchar, varchar, varchar, varchar, varchar, integer, text) IS
    'Packs validation data with the class values and normalizing constant of a training table; SELECT validation_preprocessor_dl(''help'') for usage';

-- ==== 20_model_catalog.sql ====
-- Model catalogs: architectures and model selection tables (MADlib's API).

CREATE FUNCTION @extschema@.load_keras_model(
    keras_model_arch_table varchar,
    model_arch             json,
    model_weights          bytea DEFAULT NULL,
    name                   text  DEFAULT NULL,
    description            text  DEFAULT NULL
)
RETURNS void
LANGUAGE plpython3u VOLATILE
SET jit = off
AS $python$
# ---- madlib_mop: make the in-database runtime importable (generated) ----
import sys
if '@site_packages@' not in sys.path:
    import site
    _path_before = list(sys.path)
    site.addsitedir('@site_packages@')
    # The runtime's packages come first, ahead of any the system Python may carry.
    sys.path[:] = [p for p in sys.path if p not in _path_before] + _path_before
    del _path_before
# ---- end of preamble ----
from madlib_mop.model_catalog import load_keras_model
from madlib_mop.plpy_bridge import run

run(plpy, load_keras_model, keras_model_arch_table, model_arch, model_weights, name, description)
$python$;

CREATE FUNCTION @extschema@.delete_keras_model(
    keras_model_arch_table varchar,
    model_id               integer
)
RETURNS void
LANGUAGE plpython3u VOLATILE
SET jit = off
AS $python$
# ---- madlib_mop: make the in-database runtime importable (generated) ----
import sys
if '@site_packages@' not in sys.path:
    import site
    _path_before = list(sys.path)
    site.addsitedir('@site_packages@')
    # The runtime's packages come first, ahead of any the system Python may carry.
    sys.path[:] = [p for p in sys.path if p not in _path_before] + _path_before
    del _path_before
# ---- end of preamble ----
from madlib_mop.model_catalog import delete_keras_model
from madlib_mop.plpy_bridge import run

run(plpy, delete_keras_model, keras_model_arch_table, model_id)
$python$;

CREATE FUNCTION @extschema@.generate_model_configs(
    model_arch_table      varchar,
    model_selection_table varchar,
    model_id_list         integer[],
    compile_params_grid   varchar,
    fit_params_grid       varchar,
    search_type           varchar DEFAULT 'grid',
    num_configs           integer DEFAULT NULL,
    random_state          integer DEFAULT NULL,
    object_table          varchar DEFAULT NULL
)
RETURNS void
LANGUAGE plpython3u VOLATILE
SET jit = off
AS $python$
# ---- madlib_mop: make the in-database runtime importable (generated) ----
import sys
if '@site_packages@' not in sys.path:
    import site
    _path_before = list(sys.path)
    site.addsitedir('@site_packages@')
    # The runtime's packages come first, ahead of any the system Python may carry.
    sys.path[:] = [p for p in sys.path if p not in _path_before] + _path_before
    del _path_before
# ---- end of preamble ----
from madlib_mop.model_catalog import generate_model_configs
from madlib_mop.plpy_bridge import run

run(plpy, generate_model_configs, model_arch_table, model_selection_table, model_id_list,
    compile_params_grid, fit_params_grid, search_type, num_configs, random_state, object_table)
$python$;

CREATE FUNCTION @extschema@.load_model_selection_table(
    model_arch_table      varchar,
    model_selection_table varchar,
    model_id_list         integer[],
    compile_params_list   varchar[],
    fit_params_list       varchar[],
    object_table          varchar DEFAULT NULL
)
RETURNS void
LANGUAGE plpython3u VOLATILE
SET jit = off
AS $python$
# ---- madlib_mop: make the in-database runtime importable (generated) ----
import sys
if '@site_packages@' not in sys.path:
    import site
    _path_before = list(sys.path)
    site.addsitedir('@site_packages@')
    # The runtime's packages come first, ahead of any the system Python may carry.
    sys.path[:] = [p for p in sys.path if p not in _path_before] + _path_before
    del _path_before
# ---- end of preamble ----
from madlib_mop.model_catalog import load_model_selection_table
from madlib_mop.plpy_bridge import run

run(plpy, load_model_selection_table, model_arch_table, model_selection_table, model_id_list,
    compile_params_list, fit_params_list, object_table)
$python$;

-- ==== 30_fit.sql ====
-- Model selection by model hopping: the jobs catalog, the fit functions and procedures,
-- and the segment workers' entry points.

CREATE TABLE @extschema@.jobs (
    job_id                bigserial PRIMARY KEY,
    owner                 name NOT NULL DEFAULT current_user,
    state                 text NOT NULL DEFAULT 'created'
                          CHECK (state IN ('created', 'running', 'finished', 'failed', 'interrupted')),
    model_output_table    text NOT NULL,
    source_table          text NOT NULL,
    validation_table      text,
    model_selection_table text NOT NULL,
    arguments             jsonb NOT NULL,   -- the call's arguments: a repeat call resumes
    tables                jsonb NOT NULL,   -- output and per-job tables (quoted names)
    num_models            integer NOT NULL,
    num_segments          integer NOT NULL,
    validation_partitions integer,
    seed                  integer NOT NULL,
    subepochs_total       integer NOT NULL,
    subepochs_done        integer NOT NULL DEFAULT 0,
    created_at            timestamptz NOT NULL DEFAULT now(),
    started_at            timestamptz,
    updated_at            timestamptz,
    finished_at           timestamptz,
    coordinator_pid       integer,
    last_error            text,
    -- The advisory lock its coordinator holds: random, and visible to the job's owner only
    -- (row-level security), so another role cannot take it first and block the job.
    lock_key              bigint NOT NULL DEFAULT
                          ('x' || substr(md5(gen_random_uuid()::text), 1, 16))::bit(64)::bigint
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
GRANT UPDATE (state, subepochs_done, started_at, updated_at, finished_at, coordinator_pid,
              last_error) ON @extschema@.jobs TO PUBLIC;
GRANT USAGE ON SEQUENCE @extschema@.jobs_job_id_seq TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('@extschema@.jobs', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.jobs_job_id_seq', '');

-- security_invoker: the view reads jobs as the caller, so its row-level security applies (a
-- view owned by the extension's superuser owner would bypass it and show every role's jobs).
CREATE VIEW @extschema@.job_progress WITH (security_barrier, security_invoker) AS
SELECT job_id, owner,
       -- A running job whose coordinator's session has ended is waiting for resume().
       CASE WHEN state = 'running' AND NOT EXISTS (
                SELECT 1 FROM pg_catalog.pg_stat_activity a WHERE a.pid = coordinator_pid)
            THEN 'interrupted' ELSE state END AS state,
       model_output_table,
       num_models AS models, num_segments AS segments,
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
    seed                      integer DEFAULT 0
)
RETURNS void
LANGUAGE plpython3u VOLATILE
SET jit = off
AS $python$
# ---- madlib_mop: make the in-database runtime importable (generated) ----
import sys
if '@site_packages@' not in sys.path:
    import site
    _path_before = list(sys.path)
    site.addsitedir('@site_packages@')
    # The runtime's packages come first, ahead of any the system Python may carry.
    sys.path[:] = [p for p in sys.path if p not in _path_before] + _path_before
    del _path_before
# ---- end of preamble ----
from madlib_mop.fit import fit_multiple_model
from madlib_mop.plpy_bridge import run

run(plpy, fit_multiple_model, source_table, model_output_table, model_selection_table,
    num_iterations, use_gpus, validation_table, metrics_compute_frequency, warm_start, name,
    description, use_caching, seed)
$python$;

CREATE PROCEDURE @extschema@.fit_multiple(
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
    seed                      integer DEFAULT 0
)
LANGUAGE plpython3u
AS $python$
# ---- madlib_mop: make the in-database runtime importable (generated) ----
import sys
if '@site_packages@' not in sys.path:
    import site
    _path_before = list(sys.path)
    site.addsitedir('@site_packages@')
    # The runtime's packages come first, ahead of any the system Python may carry.
    sys.path[:] = [p for p in sys.path if p not in _path_before] + _path_before
    del _path_before
# ---- end of preamble ----
from madlib_mop.fit import fit_multiple_model
from madlib_mop.plpy_bridge import run

run(plpy, fit_multiple_model, source_table, model_output_table, model_selection_table,
    num_iterations, use_gpus, validation_table, metrics_compute_frequency, warm_start, name,
    description, use_caching, seed, can_commit=True)
$python$;

CREATE FUNCTION @extschema@.resume_job(job_id bigint)
RETURNS void
LANGUAGE plpython3u VOLATILE
SET jit = off
AS $python$
# ---- madlib_mop: make the in-database runtime importable (generated) ----
import sys
if '@site_packages@' not in sys.path:
    import site
    _path_before = list(sys.path)
    site.addsitedir('@site_packages@')
    # The runtime's packages come first, ahead of any the system Python may carry.
    sys.path[:] = [p for p in sys.path if p not in _path_before] + _path_before
    del _path_before
# ---- end of preamble ----
from madlib_mop.fit import resume
from madlib_mop.plpy_bridge import run

run(plpy, resume, job_id)
$python$;

CREATE PROCEDURE @extschema@.resume(job_id bigint)
LANGUAGE plpython3u
AS $python$
# ---- madlib_mop: make the in-database runtime importable (generated) ----
import sys
if '@site_packages@' not in sys.path:
    import site
    _path_before = list(sys.path)
    site.addsitedir('@site_packages@')
    # The runtime's packages come first, ahead of any the system Python may carry.
    sys.path[:] = [p for p in sys.path if p not in _path_before] + _path_before
    del _path_before
# ---- end of preamble ----
from madlib_mop.fit import resume
from madlib_mop.plpy_bridge import run

run(plpy, resume, job_id, can_commit=True)
$python$;

-- Segment workers: called by the coordinator over its worker connections.
CREATE FUNCTION @extschema@._mop_train(job_id bigint, mst_key integer, step integer, segment integer)
RETURNS jsonb
LANGUAGE plpython3u VOLATILE
SET jit = off
AS $python$
# ---- madlib_mop: make the in-database runtime importable (generated) ----
import sys
if '@site_packages@' not in sys.path:
    import site
    _path_before = list(sys.path)
    site.addsitedir('@site_packages@')
    # The runtime's packages come first, ahead of any the system Python may carry.
    sys.path[:] = [p for p in sys.path if p not in _path_before] + _path_before
    del _path_before
# ---- end of preamble ----
from madlib_mop.plpy_bridge import run
from madlib_mop.worker import train

return run(plpy, train, job_id, mst_key, step, segment)
$python$;

CREATE FUNCTION @extschema@._mop_evaluate(job_id bigint, mst_key integer, step integer, partition integer)
RETURNS jsonb
LANGUAGE plpython3u VOLATILE
SET jit = off
AS $python$
# ---- madlib_mop: make the in-database runtime importable (generated) ----
import sys
if '@site_packages@' not in sys.path:
    import site
    _path_before = list(sys.path)
    site.addsitedir('@site_packages@')
    # The runtime's packages come first, ahead of any the system Python may carry.
    sys.path[:] = [p for p in sys.path if p not in _path_before] + _path_before
    del _path_before
# ---- end of preamble ----
from madlib_mop.plpy_bridge import run
from madlib_mop.worker import evaluate

return run(plpy, evaluate, job_id, mst_key, step, partition)
$python$;

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
LANGUAGE plpython3u VOLATILE
SET jit = off
AS $python$
# ---- madlib_mop: make the in-database runtime importable (generated) ----
import sys
if '@site_packages@' not in sys.path:
    import site
    _path_before = list(sys.path)
    site.addsitedir('@site_packages@')
    # The runtime's packages come first, ahead of any the system Python may carry.
    sys.path[:] = [p for p in sys.path if p not in _path_before] + _path_before
    del _path_before
# ---- end of preamble ----
from madlib_mop.fit import fit_single_model
from madlib_mop.plpy_bridge import run

run(plpy, fit_single_model, source_table, model, model_arch_table, model_id, compile_params,
    fit_params, num_iterations, use_gpus, validation_table, metrics_compute_frequency,
    warm_start, name, description, object_table, seed)
$python$;

CREATE FUNCTION @extschema@._mop_warm_up(segments integer)
RETURNS void
LANGUAGE plpython3u VOLATILE
SET jit = off
AS $python$
# ---- madlib_mop: make the in-database runtime importable (generated) ----
import sys
if '@site_packages@' not in sys.path:
    import site
    _path_before = list(sys.path)
    site.addsitedir('@site_packages@')
    # The runtime's packages come first, ahead of any the system Python may carry.
    sys.path[:] = [p for p in sys.path if p not in _path_before] + _path_before
    del _path_before
# ---- end of preamble ----
from madlib_mop.plpy_bridge import run
from madlib_mop.worker import warm_up

run(plpy, warm_up, segments)
$python$;

-- ==== 40_inference.sql ====
-- Evaluate and predict (MADlib's API), run on worker sessions in parallel.

CREATE FUNCTION @extschema@.madlib_keras_evaluate(
    model_table  varchar,
    test_table   varchar,
    output_table varchar,
    use_gpus     boolean DEFAULT FALSE,
    mst_key      integer DEFAULT NULL
)
RETURNS void
LANGUAGE plpython3u VOLATILE
SET jit = off
AS $python$
# ---- madlib_mop: make the in-database runtime importable (generated) ----
import sys
if '@site_packages@' not in sys.path:
    import site
    _path_before = list(sys.path)
    site.addsitedir('@site_packages@')
    # The runtime's packages come first, ahead of any the system Python may carry.
    sys.path[:] = [p for p in sys.path if p not in _path_before] + _path_before
    del _path_before
# ---- end of preamble ----
from madlib_mop.inference import evaluate
from madlib_mop.plpy_bridge import run

run(plpy, evaluate, model_table, test_table, output_table, use_gpus, mst_key)
$python$;

CREATE FUNCTION @extschema@.madlib_keras_evaluate_multiple_model(
    model_table  varchar,
    test_table   varchar,
    output_table varchar,
    use_gpus     boolean DEFAULT FALSE
)
RETURNS void
LANGUAGE plpython3u VOLATILE
SET jit = off
AS $python$
# ---- madlib_mop: make the in-database runtime importable (generated) ----
import sys
if '@site_packages@' not in sys.path:
    import site
    _path_before = list(sys.path)
    site.addsitedir('@site_packages@')
    # The runtime's packages come first, ahead of any the system Python may carry.
    sys.path[:] = [p for p in sys.path if p not in _path_before] + _path_before
    del _path_before
# ---- end of preamble ----
from madlib_mop.inference import evaluate_multiple
from madlib_mop.plpy_bridge import run

run(plpy, evaluate_multiple, model_table, test_table, output_table, use_gpus)
$python$;

CREATE FUNCTION @extschema@.madlib_keras_predict(
    model_table         varchar,
    test_table          varchar,
    id_col              varchar,
    independent_varname varchar,
    output_table        varchar,
    pred_type           varchar DEFAULT 'prob',
    use_gpus            boolean DEFAULT FALSE,
    mst_key             integer DEFAULT NULL
)
RETURNS void
LANGUAGE plpython3u VOLATILE
SET jit = off
AS $python$
# ---- madlib_mop: make the in-database runtime importable (generated) ----
import sys
if '@site_packages@' not in sys.path:
    import site
    _path_before = list(sys.path)
    site.addsitedir('@site_packages@')
    # The runtime's packages come first, ahead of any the system Python may carry.
    sys.path[:] = [p for p in sys.path if p not in _path_before] + _path_before
    del _path_before
# ---- end of preamble ----
from madlib_mop.inference import predict
from madlib_mop.plpy_bridge import run

run(plpy, predict, model_table, test_table, id_col, independent_varname, output_table, pred_type, use_gpus, mst_key)
$python$;

CREATE FUNCTION @extschema@.madlib_keras_predict_byom(
    model_arch_table    varchar,
    model_id            integer,
    test_table          varchar,
    id_col              varchar,
    independent_varname varchar,
    output_table        varchar,
    pred_type           varchar DEFAULT 'prob',
    use_gpus            boolean DEFAULT FALSE,
    class_values        text[]  DEFAULT NULL,
    normalizing_const   double precision DEFAULT NULL
)
RETURNS void
LANGUAGE plpython3u VOLATILE
SET jit = off
AS $python$
# ---- madlib_mop: make the in-database runtime importable (generated) ----
import sys
if '@site_packages@' not in sys.path:
    import site
    _path_before = list(sys.path)
    site.addsitedir('@site_packages@')
    # The runtime's packages come first, ahead of any the system Python may carry.
    sys.path[:] = [p for p in sys.path if p not in _path_before] + _path_before
    del _path_before
# ---- end of preamble ----
from madlib_mop.inference import predict_byom
from madlib_mop.plpy_bridge import run

run(plpy, predict_byom, model_arch_table, model_id, test_table, id_col, independent_varname, output_table, pred_type, use_gpus, class_values, normalizing_const)
$python$;

-- Workers' entry points.
CREATE FUNCTION @extschema@._mop_infer_evaluate(task jsonb, partition integer)
RETURNS jsonb
LANGUAGE plpython3u VOLATILE
SET jit = off
AS $python$
# ---- madlib_mop: make the in-database runtime importable (generated) ----
import sys
if '@site_packages@' not in sys.path:
    import site
    _path_before = list(sys.path)
    site.addsitedir('@site_packages@')
    # The runtime's packages come first, ahead of any the system Python may carry.
    sys.path[:] = [p for p in sys.path if p not in _path_before] + _path_before
    del _path_before
# ---- end of preamble ----
from madlib_mop.inference import worker_evaluate
from madlib_mop.plpy_bridge import run

return run(plpy, worker_evaluate, task, partition)
$python$;

CREATE FUNCTION @extschema@._mop_infer_predict(task jsonb, first_block bigint, last_block bigint, weights bytea)
RETURNS jsonb
LANGUAGE plpython3u VOLATILE
SET jit = off
AS $python$
# ---- madlib_mop: make the in-database runtime importable (generated) ----
import sys
if '@site_packages@' not in sys.path:
    import site
    _path_before = list(sys.path)
    site.addsitedir('@site_packages@')
    # The runtime's packages come first, ahead of any the system Python may carry.
    sys.path[:] = [p for p in sys.path if p not in _path_before] + _path_before
    del _path_before
# ---- end of preamble ----
from madlib_mop.inference import worker_predict
from madlib_mop.plpy_bridge import run

return run(plpy, worker_predict, task, first_block, last_block, weights)
$python$;

-- ==== 90_usage.sql ====
-- Usage texts: each function called with no argument, 'help', 'usage' or '?' (as in MADlib).

CREATE FUNCTION @extschema@.usage(function_name text, message text DEFAULT '')
RETURNS text
LANGUAGE plpython3u IMMUTABLE
SET jit = off
AS $python$
# ---- madlib_mop: make the in-database runtime importable (generated) ----
import sys
if '@site_packages@' not in sys.path:
    import site
    _path_before = list(sys.path)
    site.addsitedir('@site_packages@')
    # The runtime's packages come first, ahead of any the system Python may carry.
    sys.path[:] = [p for p in sys.path if p not in _path_before] + _path_before
    del _path_before
# ---- end of preamble ----
from madlib_mop.plpy_bridge import run
from madlib_mop.usage import usage

return run(plpy, usage, function_name, message)
$python$;

-- f(message varchar DEFAULT '') for each function with a usage text.
DO $usage$
DECLARE
    function_name text;
BEGIN
    FOREACH function_name IN ARRAY ARRAY[
        'training_preprocessor_dl', 'validation_preprocessor_dl', 'load_keras_model',
        'delete_keras_model', 'generate_model_configs', 'load_model_selection_table']
    LOOP
        EXECUTE format(
            'CREATE FUNCTION %I.%I(message varchar DEFAULT %L) RETURNS varchar '
            'LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS %L',
            '@extschema@', function_name, '',
            format('SELECT %I.usage(%L, message)', '@extschema@', function_name));
    END LOOP;
END
$usage$;

-- ==== build ====
CREATE FUNCTION @extschema@.build_id() RETURNS text LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$ SELECT '0.1.0+a52e960daaebbde6'::text $$;
