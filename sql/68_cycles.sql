-- Model selection in cycles over a table that keeps growing: each cycle packs the new rows
-- (preprocessor_dl_append), then trains the best models of the cycle before, warm-started
-- from their weights, together with new configurations (madlib_mop.api.cycles).

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
-- (One line each: an update script takes a table's statements by their first line.)
GRANT UPDATE (arguments, state, num_rows, appended, validation_rows, model_selection_table, model_output_table, job_id, carried, configurations, objective, best_mst_key, best_value, finished_at) ON @extschema@.cycles TO PUBLIC;
-- A role abandons a cycle of its own by deleting its row (row-level security: its own).
GRANT DELETE ON @extschema@.cycles TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('@extschema@.cycles', '');

-- security_invoker: read as the caller, so that each role sees its own cycles.
CREATE VIEW @extschema@.cycle_results WITH (security_barrier, security_invoker) AS
SELECT cycle_name, cycle, state, num_rows, appended, configurations,
       pg_catalog.jsonb_array_length(coalesce(carried, '[]')) AS carried_over,
       objective, best_mst_key, best_value, model_output_table, job_id,
       round(extract(epoch FROM finished_at - started_at)::numeric, 1) AS seconds
FROM @extschema@.cycles;
COMMENT ON VIEW @extschema@.cycle_results IS
    'Cycles side by side: data size, configurations, models carried over, the best model and its value';
GRANT SELECT ON @extschema@.cycle_results TO PUBLIC;

CREATE FUNCTION @extschema@.model_selection_cycle(
    cycle_name            varchar,   -- outputs <cycle_name>_c1, _c2, ...
    packed_table          varchar,   -- training data packed with key_column
    source_table          varchar,   -- its grown source (or a table or view of new rows)
    model_selection_table varchar,   -- this cycle's new configurations (NULL: none)
    num_iterations        integer,
    validation_table      varchar DEFAULT NULL,  -- packed with key_column
    validation_source     varchar DEFAULT NULL,  -- its grown source (NULL: not appended)
    top_k                 integer DEFAULT 3,     -- models of the last cycle carried over
    metrics_compute_frequency integer DEFAULT NULL,
    seed                  integer DEFAULT 0
)
RETURNS void
#plpython "model_selection_cycle.py"
COMMENT ON FUNCTION @extschema@.model_selection_cycle IS
    'A model selection cycle over a growing table; it commits between its steps: CALL run_cycle(...)';

#procedure run_cycle FROM model_selection_cycle
COMMENT ON PROCEDURE @extschema@.run_cycle IS
    'CALL run_cycle(...): packs the new rows, then trains the best models of the last cycle (warm-started) with new configurations, and records the cycle';
