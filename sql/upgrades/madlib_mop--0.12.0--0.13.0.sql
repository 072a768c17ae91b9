-- madlib_mop 0.12.0 -> 0.13.0
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.13.0'" to load this file. \quit

-- The preprocessors take key_column.  Their earlier signatures go (any an earlier version
-- left: an update runs each step's routines as this version has them), so that a call of
-- their first arguments names one function; this version's come back with the routines.
DO $drop$
DECLARE
    routine regprocedure;
BEGIN
    FOR routine IN
        SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
        WHERE p.pronamespace = '@extschema@'::regnamespace
          AND p.proname IN ('training_preprocessor_dl', 'validation_preprocessor_dl')
    LOOP
        EXECUTE format('DROP FUNCTION %s', routine);
    END LOOP;
END
$drop$;
-- Model selection in cycles over a growing table (sql/68_cycles.sql).
-- cycles (as 0.13.0 has it)
CREATE TABLE @extschema@.cycles (
    cycle_name            text NOT NULL,
    cycle                 integer NOT NULL,   -- 1, 2, ...
    owner                 name NOT NULL DEFAULT current_user,
    state                 text NOT NULL DEFAULT 'packing'
                          CHECK (state IN ('packing', 'training', 'finished')),
    arguments             jsonb NOT NULL,     -- the call's arguments: a repeat call continues
    num_rows              bigint,             -- training rows the cycle trained on
    appended              bigint,             -- of which new since the cycle before
    validation_rows       bigint,
    model_selection_table text,               -- the cycle's configurations, carried ones first
    model_output_table    text,
    job_id                bigint,
    carried               jsonb,              -- [{mst_key, from_mst_key, model_id}]
    configurations        integer,
    objective             text,               -- what the job ranked its models by
    best_mst_key          integer,
    best_value            double precision,
    started_at            timestamptz NOT NULL DEFAULT now(),
    finished_at           timestamptz,
    PRIMARY KEY (owner, cycle_name, cycle)
);
COMMENT ON TABLE @extschema@.cycles IS
    'Model selection cycles over growing tables (run_cycle): one row per cycle; each role sees its own';
ALTER TABLE @extschema@.cycles ENABLE ROW LEVEL SECURITY;
CREATE POLICY cycles_of_their_owner ON @extschema@.cycles
    USING (owner = current_user) WITH CHECK (owner = current_user);
GRANT SELECT ON @extschema@.cycles TO PUBLIC;
GRANT INSERT (cycle_name, cycle, arguments) ON @extschema@.cycles TO PUBLIC;
GRANT UPDATE (arguments, state, num_rows, appended, validation_rows, model_selection_table, model_output_table, job_id, carried, configurations, objective, best_mst_key, best_value, finished_at) ON @extschema@.cycles TO PUBLIC;
GRANT DELETE ON @extschema@.cycles TO PUBLIC;

SELECT pg_catalog.pg_extension_config_dump('@extschema@.cycles', '');
-- cycle_results (as 0.13.0 has it)
CREATE VIEW @extschema@.cycle_results WITH (security_barrier, security_invoker) AS
SELECT cycle_name, cycle, state, num_rows, appended, configurations,
       pg_catalog.jsonb_array_length(coalesce(carried, '[]')) AS carried_over,
       objective, best_mst_key, best_value, model_output_table, job_id,
       round(extract(epoch FROM finished_at - started_at)::numeric, 1) AS seconds
FROM @extschema@.cycles;
COMMENT ON VIEW @extschema@.cycle_results IS
    'Cycles side by side: data size, configurations, models carried over, the best model and its value';
GRANT SELECT ON @extschema@.cycle_results TO PUBLIC;

-- Staged features kept across jobs (sql/67_transfer.sql).
-- staged_features (as 0.13.0 has it)
CREATE UNLOGGED TABLE @extschema@.staged_features (
    owner     name NOT NULL DEFAULT current_user,
    source    oid NOT NULL,        -- the packed table (a segment server's: its own table)
    segment   integer NOT NULL,
    prefix    text NOT NULL,       -- the frozen layers' digest
    buffer_id integer NOT NULL,
    rows      integer NOT NULL,    -- the buffer's rows
    x bytea NOT NULL, xs integer[] NOT NULL, y bytea NOT NULL, ys integer[] NOT NULL,
    PRIMARY KEY (owner, source, segment, prefix, buffer_id, rows)
);
COMMENT ON TABLE @extschema@.staged_features IS
    'Staged features kept across jobs: a buffer through a frozen prefix, computed once (a cache; each role sees its own)';
ALTER TABLE @extschema@.staged_features ALTER COLUMN x SET STORAGE EXTERNAL;
ALTER TABLE @extschema@.staged_features ENABLE ROW LEVEL SECURITY;
CREATE POLICY staged_features_of_their_owner ON @extschema@.staged_features
    USING (owner = current_user) WITH CHECK (owner = current_user);
GRANT SELECT, DELETE ON @extschema@.staged_features TO PUBLIC;
GRANT INSERT (source, segment, prefix, buffer_id, rows, x, xs, y, ys) ON @extschema@.staged_features TO PUBLIC;
-- @routines
-- (What ran here after the routines runs after them in the latest update script.)
