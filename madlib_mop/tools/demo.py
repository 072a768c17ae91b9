"""`make demo`: model selection by model hopping on a real data set, in the server.

Creates the extension (schema madlib_mop) if it is missing, loads scikit-learn's digits
(8x8 images, 10 classes) and iris data sets into schema madlib_mop_demo, packs digits over
2 segments, and trains 8 configurations (2 architectures x 2 learning rates x 2 batch sizes)
at once with madlib_keras_fit_multiple_model, validating on held-out images; then prints
the leaderboard.  Everything it creates lives in the schema madlib_mop_demo.

    python -m madlib_mop.tools.demo            # uses MADLIB_MOP_DSN, else the embedded server
"""

from __future__ import annotations

import sys
import time

import psycopg
from psycopg import sql

from madlib_mop.tools.embedded import EmbeddedCluster, configured_dsn
from madlib_mop.tools.extension_build import built_id

DEMO_SCHEMA = "madlib_mop_demo"
EXTENSION_SCHEMA = "madlib_mop"


def ensure_extension(conn: psycopg.Connection, schema: str = EXTENSION_SCHEMA) -> str:
    """Create or update the extension; return the schema it lives in.

    In the embedded server's own database, an extension installed by an earlier build of
    the same version is replaced (development); elsewhere it is only updated."""
    row = conn.execute(
        "SELECT extnamespace::regnamespace::text, extversion FROM pg_extension "
        "WHERE extname = 'madlib_mop'"
    ).fetchone()
    if row is not None and configured_dsn() == EmbeddedCluster().dsn():
        installed = conn.execute(sql.SQL("SELECT {}.build_id()").format(sql.Identifier(row[0]))).fetchone()[0] \
            if conn.execute("SELECT to_regproc(%s) IS NOT NULL", (f"{row[0]}.build_id",)).fetchone()[0] else None
        if installed != built_id():
            conn.execute("DROP EXTENSION madlib_mop CASCADE")
            row = None
    if row is None:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(
            sql.SQL("CREATE EXTENSION madlib_mop SCHEMA {} CASCADE").format(sql.Identifier(schema))
        )
        return schema
    conn.execute("ALTER EXTENSION madlib_mop UPDATE")
    return row[0]


def _demo_schema(conn: psycopg.Connection) -> None:
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(DEMO_SCHEMA)))


def load_iris(conn: psycopg.Connection) -> str:
    """Load iris into madlib_mop_demo.iris (id, attributes float8[], class_text text)."""
    from sklearn.datasets import load_iris as sklearn_iris

    data = sklearn_iris()
    _demo_schema(conn)
    table = sql.Identifier(DEMO_SCHEMA, "iris")
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))
    conn.execute(sql.SQL(
        "CREATE TABLE {} (id integer PRIMARY KEY, attributes double precision[] NOT NULL, "
        "class_text text NOT NULL)").format(table))
    with conn.cursor().copy(sql.SQL("COPY {} (id, attributes, class_text) FROM STDIN").format(table)) as copy:
        for i, (features, target) in enumerate(zip(data.data, data.target), start=1):
            copy.write_row((i, [float(v) for v in features], str(data.target_names[target])))
    return f"{DEMO_SCHEMA}.iris"


def load_digits(conn: psycopg.Connection) -> str:
    """Load digits into madlib_mop_demo.digits (id, image real[8][8][1], digit integer)."""
    from sklearn.datasets import load_digits as sklearn_digits

    data = sklearn_digits()
    _demo_schema(conn)
    table = sql.Identifier(DEMO_SCHEMA, "digits")
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))
    conn.execute(sql.SQL("CREATE TABLE {} (id integer PRIMARY KEY, image real[] NOT NULL, "
                         "digit integer NOT NULL)").format(table))
    with conn.cursor().copy(sql.SQL("COPY {} FROM STDIN").format(table)) as copy:
        for i, (image, target) in enumerate(zip(data.images, data.target), start=1):
            copy.write_row((i, image.reshape(8, 8, 1).tolist(), int(target)))
    return f"{DEMO_SCHEMA}.digits"


def cifar_shaped_images(rows: int, seed: int, classes: int = 10):
    """CIFAR-10-shaped images (rows, 32, 32, 3) in [0, 1], float32, and their classes.
    Nothing can be downloaded here, so the images have structure made for a CNN to learn:
    each class a smooth colour pattern of its own (products of sine waves, drawn once from
    a fixed seed), shown moved by up to 4 pixels each way, at a random contrast, under
    noise (all drawn from `seed`)."""
    import numpy as np

    waves_rng = np.random.default_rng(1234)
    grid = np.linspace(0, 2 * np.pi, 32, dtype=np.float32)
    waves = np.sin(np.outer(grid, waves_rng.uniform(0.5, 3, 3 * classes)) +
                   waves_rng.uniform(0, np.pi, 3 * classes)).astype(np.float32)
    patterns = np.stack([np.stack([np.outer(waves[:, 3 * c + k], waves[::-1, 3 * c + (k + 1) % 3])
                                   for k in range(3)], axis=-1) for c in range(classes)])
    moves = [(dy, dx) for dy in range(-4, 5) for dx in range(-4, 5)]
    moved = np.stack([np.roll(patterns, move, axis=(1, 2)) for move in moves], axis=1)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, rows)
    images = moved[labels, rng.integers(0, len(moves), rows)]
    images *= rng.uniform(0.3, 1.0, (rows, 1, 1, 1)).astype(np.float32)
    images += rng.standard_normal((rows, 32, 32, 3), dtype=np.float32)
    return np.clip((images + 3) / 6, 0, 1), labels


def _layer(class_name: str, **config) -> dict:
    return {"class_name": class_name, "config": config}


def _architectures() -> list[tuple[str, str]]:
    """Two architectures as a MADlib user has them: tf.keras-style JSON (written here by
    hand; no TensorFlow needed on the client)."""
    import json

    shape = {"batch_input_shape": [None, 8, 8, 1]}
    mlp = [_layer("Flatten", **shape), _layer("Dense", units=32, activation="relu"),
           _layer("Dense", units=10, activation="softmax")]
    cnn = [_layer("Conv2D", filters=16, kernel_size=[3, 3], activation="relu", **shape),
           _layer("Flatten"), _layer("Dense", units=32, activation="relu"),
           _layer("Dense", units=10, activation="softmax")]
    return [(name, json.dumps({"class_name": "Sequential", "config": {"name": name, "layers": layers}}))
            for name, layers in (("mlp_64_32_10", mlp), ("cnn_16x3x3_32_10", cnn))]


def main() -> int:
    dsn = configured_dsn()
    print(f"server: {dsn}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        schema = ensure_extension(conn)
        version = conn.execute(sql.SQL("SELECT {}.version()").format(sql.Identifier(schema))).fetchone()[0]
        print(f"extension madlib_mop in schema {schema}: {version}")
        load_iris(conn)
        load_digits(conn)
        print(f"loaded scikit-learn's digits (1797 images of 8x8) and iris into schema {DEMO_SCHEMA}")
        for table in ("digits_packed", "digits_valid", "model_arch", "mst", "digits_models"):
            for suffix in ("", "_summary", "_info", "_mop_models", "_mop_state", "_mop_visits",
                           "_mop_evals", "_mop_weights"):
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(
                    sql.Identifier(DEMO_SCHEMA, table + suffix)))
        conn.execute(sql.SQL("SET search_path = {}, {}").format(
            sql.Identifier(DEMO_SCHEMA), sql.Identifier(schema)))
        conn.add_notice_handler(lambda diag: print("  " + diag.message_primary, flush=True))
        conn.execute("CREATE TEMP VIEW digits_train AS SELECT * FROM digits WHERE id % 5 <> 0")
        conn.execute("CREATE TEMP VIEW digits_test AS SELECT * FROM digits WHERE id % 5 = 0")
        print("\npacking: 80% for training over 2 segments, 20% for validation")
        conn.execute("SELECT training_preprocessor_dl('digits_train', 'digits_packed', 'digit', 'image', "
                     "normalizing_const => 16, distribution_rules => '2')")
        conn.execute("SELECT validation_preprocessor_dl('digits_test', 'digits_valid', 'digit', 'image', "
                     "'digits_packed')")
        names = {}
        for name, arch in _architectures():
            conn.execute("SELECT load_keras_model('model_arch', %s::json, NULL, %s)", (arch, name))
        names = dict(conn.execute("SELECT model_id, name FROM model_arch").fetchall())
        conn.execute("""SELECT generate_model_configs('model_arch', 'mst', ARRAY[1, 2],
            $${'loss': ['categorical_crossentropy'],
               'optimizer_params_list': [{'optimizer': ['Adam'], 'lr': [0.001, 0.01]}],
               'metrics': ['accuracy']}$$,
            $${'batch_size': [16, 64], 'epochs': [1]}$$)""")
        print("\ntraining 8 configurations at once by model hopping (5 iterations):")
        started = time.perf_counter()
        conn.execute("SELECT madlib_keras_fit_multiple_model('digits_packed', 'digits_models', 'mst', "
                     "5, FALSE, 'digits_valid', 1)")
        elapsed = time.perf_counter() - started
        rows = conn.execute("""
            SELECT i.mst_key, i.model_id, i.compile_params, i.fit_params,
                   i.validation_metrics_final, i.validation_loss_final, i.training_seconds
            FROM digits_models_info i ORDER BY i.validation_metrics_final DESC, i.mst_key""").fetchall()
        importance = conn.execute("SELECT * FROM hyperparameter_importance('digits_models')").fetchall()
        front = conn.execute("""
            SELECT f.mst_key, i.validation_metrics_final, i.inference_ms_per_row, i.parameter_count
            FROM pareto_front('digits_models', ARRAY['validation_metrics_final max',
                                                     'inference_ms_per_row min']) f
            JOIN digits_models_info i USING (mst_key) ORDER BY i.inference_ms_per_row""").fetchall()
    print(f"\nleaderboard (validation on {DEMO_SCHEMA}.digits_valid; whole job {elapsed:.1f}s):\n")
    print(f"{'mst_key':>7}  {'model':<18} {'optimizer':<20} {'batch':>5}  {'val acc':>7}  "
          f"{'val loss':>8}  {'train s':>7}")
    for mst_key, model_id, compile_params, fit_params, accuracy, loss, seconds in rows:
        optimizer = compile_params.split("'")[1]
        batch = fit_params.split("batch_size=")[1].split(",")[0]
        print(f"{mst_key:>7}  {names[model_id]:<18} {optimizer:<20} {batch:>5}  {accuracy:7.4f}  "
              f"{loss:8.4f}  {seconds:7.1f}")
    print("\nwhich hyperparameters mattered (hyperparameter_importance, Optuna's fANOVA):")
    for name, value in importance:
        print(f"  {name:<14} {value:5.2f}  {'#' * round(40 * value)}")
    print("\nPareto front, validation accuracy against inference cost (pareto_front):")
    for mst_key, accuracy, ms_per_row, parameters in front:
        print(f"  mst_key {mst_key:>2}  val acc {accuracy:.4f}  {ms_per_row * 1000:7.2f} us/row  "
              f"{parameters:>6} parameters")
    print(f'\nTry it yourself:  psql "$(make -s dsn)" -c "SELECT * FROM {schema}.job_progress"')
    print(f'Plots and a summary:  MADLIB_MOP_DSN="$(make -s dsn)" .venv/bin/madlib-mop report '
          f'{DEMO_SCHEMA}.digits_models --out /tmp/madlib_mop_demo_report')
    return 0


if __name__ == "__main__":
    sys.exit(main())
