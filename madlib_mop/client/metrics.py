"""The server's worker pool, queue and jobs as Prometheus metrics, read at each scrape.

`madlib-mop exporter` serves them on `/metrics` (and the dashboard does, for the role it
runs as).  Read through one database of the server, as the role connected: a superuser
sees every role's jobs, another role its own (the jobs' row-level security):

    madlib_mop_worker_sessions{database, role, state}   worker sessions alive: busy or idle
    madlib_mop_worker_slots{database, state}             the cap's slots: taken or free
    madlib_mop_calls_queued{database, role}              calls waiting for a worker session
    madlib_mop_queue_oldest_wait_seconds{database}       how long the first of them waits
    madlib_mop_jobs{database, role, state}               jobs by state (job_progress's)
    madlib_mop_subepochs_finished_total{database, role}  sub-epochs the jobs have finished
    madlib_mop_subepoch_seconds{database, role}          a histogram of sub-epochs' seconds
                                                         (each visit's total, from the
                                                         visits tables the role may read)

Where the extension's library is preloaded, the slots, the sessions and the queue are the
server's, every database's (its shared memory); else those of the connected database.  Jobs
are the connected database's.
"""

from __future__ import annotations

from typing import Iterator

import sqlalchemy as sa
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from madlib_mop.client import frames
from madlib_mop.engine.server_slots import Pool
from madlib_mop.job.record import JobState

# Sub-epochs take from milliseconds (a small MLP on a small segment) to minutes (a ResNet).
SUBEPOCH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

class PoolCollector(Collector):
    """A Prometheus collector over one database of the server (see the module's text)."""

    def __init__(self, engine: sa.Engine, schema: str):
        self.engine, self.schema = engine, frames.quote(schema)

    def collect(self) -> Iterator:
        with self.engine.connect() as conn:
            database = conn.execute(sa.text("SELECT current_database()")).scalar()
            shared = conn.execute(sa.text(f"SELECT {self.schema}._mop_pool_shared()")).scalar()
            pool = Pool(self.schema, shared)
            yield from self._pool(conn, pool, database)
            yield from self._queue(conn, pool, database)
            yield from self._jobs(conn, database)

    def _pool(self, conn: sa.Connection, pool: Pool, database: str) -> Iterator:
        sessions = GaugeMetricFamily("madlib_mop_worker_sessions", "Worker sessions alive, busy or idle",
                                     labels=["database", "role", "state"])
        taken = 0
        for row in conn.execute(sa.text(f"SELECT database, role, state, count(*) AS sessions "
                                        f"FROM ({pool.slots}) s GROUP BY 1, 2, 3 ORDER BY 1, 2, 3")):
            sessions.add_metric([row.database, row.role, row.state], row.sessions)
            taken += row.sessions
        yield sessions
        cap = conn.execute(sa.text(f"SELECT {self.schema}._mop_worker_cap()")).scalar()
        slots = GaugeMetricFamily("madlib_mop_worker_slots", "The cap's worker slots: taken or free",
                                  labels=["database", "state"])
        slots.add_metric([database, "taken"], taken)
        slots.add_metric([database, "free"], max(0, cap - taken))
        yield slots

    def _queue(self, conn: sa.Connection, pool: Pool, database: str) -> Iterator:
        rows = conn.execute(sa.text(
            "SELECT q.database, q.role, count(*) AS calls, "
            f"extract(epoch FROM clock_timestamp() - min(q.since)) AS waited FROM ({pool.queue}) q "
            "GROUP BY 1, 2 ORDER BY 1, 2")).all()
        queued = GaugeMetricFamily("madlib_mop_calls_queued", "Calls waiting for a worker session",
                                   labels=["database", "role"])
        for row in rows:
            queued.add_metric([row.database, row.role], row.calls)
        yield queued
        oldest = GaugeMetricFamily("madlib_mop_queue_oldest_wait_seconds",
                                   "How long the longest-waiting call has waited (0: none waits)",
                                   labels=["database"])
        oldest.add_metric([database], max([float(row.waited) for row in rows], default=0.0))
        yield oldest

    def _jobs(self, conn: sa.Connection, database: str) -> Iterator:
        states = GaugeMetricFamily("madlib_mop_jobs", "Jobs by state", labels=["database", "role", "state"])
        finished = CounterMetricFamily("madlib_mop_subepochs_finished", "Sub-epochs the jobs have finished",
                                       labels=["database", "role"])
        counts: dict[tuple[str, str], int] = {}
        done: dict[str, int] = {}
        for row in conn.execute(sa.text(f"SELECT owner, state, subepochs_done FROM {self.schema}.job_progress")):
            counts[(row.owner, row.state)] = counts.get((row.owner, row.state), 0) + 1
            done[row.owner] = done.get(row.owner, 0) + row.subepochs_done
        for role in sorted({role for role, _ in counts}):
            for state in JobState:
                states.add_metric([database, role, state.value], counts.get((role, state.value), 0))
            finished.add_metric([database, role], done[role])
        yield states
        yield finished
        yield self._subepoch_seconds(conn, database)

    def _subepoch_seconds(self, conn: sa.Connection, database: str) -> HistogramMetricFamily:
        """Each role's visits, from the visits tables of its jobs that this role may read."""
        histogram = HistogramMetricFamily("madlib_mop_subepoch_seconds", "Seconds of each sub-epoch",
                                          labels=["database", "role"])
        tables = conn.execute(sa.text(
            f"SELECT j.owner, format('%I.%I', j.tables->'visits'->>0, j.tables->'visits'->>1) AS visits "
            f"FROM {self.schema}.jobs j WHERE to_regclass(format('%I.%I', j.tables->'visits'->>0, "
            "j.tables->'visits'->>1)) IS NOT NULL ORDER BY j.owner, j.job_id")).all()
        by_role: dict[str, list[str]] = {}
        for row in tables:
            readable = conn.execute(sa.text("SELECT has_table_privilege(CAST(:t AS regclass), 'SELECT')"),
                                    {"t": row.visits}).scalar()
            if readable:
                by_role.setdefault(row.owner, []).append(row.visits)
        bounds = ", ".join(f"count(*) FILTER (WHERE s <= {b})" for b in SUBEPOCH_BUCKETS)
        for role, visits in sorted(by_role.items()):
            union = " UNION ALL ".join(  # names quoted by format() above
                f"SELECT (result->'seconds'->>'total')::float8 AS s FROM {table}" for table in visits)
            row = conn.execute(sa.text(f"SELECT {bounds}, count(*), coalesce(sum(s), 0) FROM ({union}) v "
                                       "WHERE s IS NOT NULL")).one()
            buckets = [(str(b), row[i]) for i, b in enumerate(SUBEPOCH_BUCKETS)]
            buckets.append(("+Inf", row[len(SUBEPOCH_BUCKETS)]))
            histogram.add_metric([database, role], buckets, float(row[-1]))
        return histogram


def metrics_text(engine: sa.Engine, schema: str) -> bytes:
    """The metrics in Prometheus' text format, read now."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(PoolCollector(engine, schema))
    return generate_latest(registry)
