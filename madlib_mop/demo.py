"""`make demo`: the extension at work on a real data set, in the server.

Creates the extension (schema madlib_mop) if it is missing, loads scikit-learn's iris data
set into madlib_mop_demo.iris, and has the server train a Keras model on it through
PL/Python.  Everything it creates lives in the schema madlib_mop_demo.

    python -m madlib_mop.demo            # uses MADLIB_MOP_DSN, else the embedded server
"""

from __future__ import annotations

import json
import sys
import time

import psycopg
from psycopg import sql

from madlib_mop.embedded import configured_dsn

DEMO_SCHEMA = "madlib_mop_demo"
EXTENSION_SCHEMA = "madlib_mop"


def ensure_extension(conn: psycopg.Connection, schema: str = EXTENSION_SCHEMA) -> str:
    """Create or update the extension; return the schema it lives in."""
    row = conn.execute(
        "SELECT extnamespace::regnamespace::text, extversion FROM pg_extension "
        "WHERE extname = 'madlib_mop'"
    ).fetchone()
    if row is None:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(
            sql.SQL("CREATE EXTENSION madlib_mop SCHEMA {} CASCADE").format(sql.Identifier(schema))
        )
        return schema
    conn.execute("ALTER EXTENSION madlib_mop UPDATE")
    return row[0]


def load_iris(conn: psycopg.Connection) -> str:
    """Load iris into madlib_mop_demo.iris (id, attributes float8[], class_text text)."""
    from sklearn.datasets import load_iris as sklearn_iris

    data = sklearn_iris()
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(DEMO_SCHEMA)))
    table = sql.Identifier(DEMO_SCHEMA, "iris")
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))
    conn.execute(sql.SQL(
        "CREATE TABLE {} (id integer PRIMARY KEY, attributes double precision[] NOT NULL, "
        "class_text text NOT NULL)").format(table))
    with conn.cursor().copy(sql.SQL("COPY {} (id, attributes, class_text) FROM STDIN").format(table)) as copy:
        for i, (features, target) in enumerate(zip(data.data, data.target), start=1):
            copy.write_row((i, [float(v) for v in features], str(data.target_names[target])))
    return f"{DEMO_SCHEMA}.iris"


def main() -> int:
    dsn = configured_dsn()
    print(f"server: {dsn}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        schema = ensure_extension(conn)
        print(f"extension madlib_mop is installed in schema {schema}")
        table = load_iris(conn)
        count = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
            sql.Identifier(DEMO_SCHEMA, "iris"))).fetchone()[0]
        print(f"loaded scikit-learn's iris data set: {count} rows into {table}")

        started = time.perf_counter()
        version = conn.execute(sql.SQL("SELECT {}.version()").format(sql.Identifier(schema))).fetchone()[0]
        print(f"in-database runtime: {version}")
        report = conn.execute(
            sql.SQL("SELECT {}.runtime_check(%s, %s, %s, epochs => %s)").format(sql.Identifier(schema)),
            (table, "class_text", "attributes", 30),
        ).fetchone()[0]
        elapsed = time.perf_counter() - started
    if isinstance(report, str):
        report = json.loads(report)
    print(
        f"\nThe server read {report['rows']} rows x {report['features']} features from "
        f"{report['source_table']} and trained a Keras model (TensorFlow {report['tensorflow']}) "
        f"for {report['epochs']} epochs inside PostgreSQL, in PL/Python:"
    )
    print(f"  classes: {', '.join(report['class_values'])}")
    print(f"  {'epoch':>5}  {'loss':>8}  {'accuracy':>8}")
    for epoch in sorted({0, 4, 9, 19, report['epochs'] - 1}):
        if epoch < report["epochs"]:
            print(f"  {epoch + 1:>5}  {report['loss'][epoch]:8.4f}  {report['accuracy'][epoch]:8.4f}")
    print(f"  read {report['read_seconds']}s, train {report['train_seconds']}s, "
          f"whole call (with TensorFlow import) {elapsed:.1f}s")
    print(f'\nTry it yourself:  psql "$(make -s dsn)" -c "SELECT {schema}.version()"')
    return 0


if __name__ == "__main__":
    sys.exit(main())
