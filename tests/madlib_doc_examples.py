"""Apache MADlib's documented deep-learning examples, as statements run in the docs' order
(tests/test_madlib_examples.py checks what they return).

The statements are the doc comments' SQL of apache/madlib (src/ports/postgres/modules/
deep_learning/*.sql_in, MADlib 2.x), copied with only the schema changed (`madlib.` ->
`madlib_mop.`); the doc's `--` comments are kept where they were.  The examples are
sequences: a later statement reads the tables an earlier one wrote, and examples re-create
tables of the same names (iris_model, model_arch_library, mst_table, iris_predict).  So each
documented example is one function that runs its statements in order on an `Example` and
keeps every output (or the statement that failed, and its error); the test module chains
them as module-scoped fixtures in the docs' order (4.1 -> 4.2 -> load_keras_model -> model
selection -> fit multiple).

Departures from the docs, each said where it is made:
* `madlib.train_test_split` is not one of this extension's functions: plain SQL makes the same
  split shape (120 train rows, 30 test rows) deterministically.
* iris comes from scikit-learn (the doc's 150-row INSERT, generated: same ids, same values).
* examples needing what this extension refuses on purpose (custom Python functions, GPUs) or data
  not here (images) are left out, with the reason.
No num_iterations, epochs or model selection row was cut: the docs' values run in about 20 s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import psycopg

# ---- the doc's Keras 2.1.6 JSON, verbatim -----------------------------------------------------

# madlib_keras.sql_in step 3 / keras_model_arch_table.sql_in / model selection model1:
# Dense(10, relu, input_shape=(4,)), Dense(10, relu), Dense(3, softmax).
MODEL_SIMPLE_JSON = '{"class_name": "Sequential", "keras_version": "2.1.6", "config": [{"class_name": "Dense", "config": {"kernel_initializer": {"class_name": "VarianceScaling", "config": {"distribution": "uniform", "scale": 1.0, "seed": null, "mode": "fan_avg"}}, "name": "dense_1", "kernel_constraint": null, "bias_regularizer": null, "bias_constraint": null, "dtype": "float32", "activation": "relu", "trainable": true, "kernel_regularizer": null, "bias_initializer": {"class_name": "Zeros", "config": {}}, "units": 10, "batch_input_shape": [null, 4], "use_bias": true, "activity_regularizer": null}}, {"class_name": "Dense", "config": {"kernel_initializer": {"class_name": "VarianceScaling", "config": {"distribution": "uniform", "scale": 1.0, "seed": null, "mode": "fan_avg"}}, "name": "dense_2", "kernel_constraint": null, "bias_regularizer": null, "bias_constraint": null, "activation": "relu", "trainable": true, "kernel_regularizer": null, "bias_initializer": {"class_name": "Zeros", "config": {}}, "units": 10, "use_bias": true, "activity_regularizer": null}}, {"class_name": "Dense", "config": {"kernel_initializer": {"class_name": "VarianceScaling", "config": {"distribution": "uniform", "scale": 1.0, "seed": null, "mode": "fan_avg"}}, "name": "dense_3", "kernel_constraint": null, "bias_regularizer": null, "bias_constraint": null, "activation": "softmax", "trainable": true, "kernel_regularizer": null, "bias_initializer": {"class_name": "Zeros", "config": {}}, "units": 3, "use_bias": true, "activity_regularizer": null}}], "backend": "tensorflow"}'

# madlib_keras.sql_in "Transfer Learning": the same with the first layer trainable=False.
MODEL_TRANSFER_JSON = '{"class_name": "Sequential", "keras_version": "2.1.6", "config": [{"class_name": "Dense", "config": {"kernel_initializer": {"class_name": "VarianceScaling", "config": {"distribution": "uniform", "scale": 1.0, "seed": null, "mode": "fan_avg"}}, "name": "dense_2", "kernel_constraint": null, "bias_regularizer": null, "bias_constraint": null, "dtype": "float32", "activation": "relu", "trainable": false, "kernel_regularizer": null, "bias_initializer": {"class_name": "Zeros", "config": {}}, "units": 10, "batch_input_shape": [null, 4], "use_bias": true, "activity_regularizer": null}}, {"class_name": "Dense", "config": {"kernel_initializer": {"class_name": "VarianceScaling", "config": {"distribution": "uniform", "scale": 1.0, "seed": null, "mode": "fan_avg"}}, "name": "dense_3", "kernel_constraint": null, "bias_regularizer": null, "bias_constraint": null, "activation": "relu", "trainable": true, "kernel_regularizer": null, "bias_initializer": {"class_name": "Zeros", "config": {}}, "units": 10, "use_bias": true, "activity_regularizer": null}}, {"class_name": "Dense", "config": {"kernel_initializer": {"class_name": "VarianceScaling", "config": {"distribution": "uniform", "scale": 1.0, "seed": null, "mode": "fan_avg"}}, "name": "dense_4", "kernel_constraint": null, "bias_regularizer": null, "bias_constraint": null, "activation": "softmax", "trainable": true, "kernel_regularizer": null, "bias_initializer": {"class_name": "Zeros", "config": {}}, "units": 3, "use_bias": true, "activity_regularizer": null}}], "backend": "tensorflow"}'

# model selection / fit multiple model2: three hidden Dense(10, relu) layers.
MODEL2_JSON = '{"class_name": "Sequential", "keras_version": "2.1.6", "config": [{"class_name": "Dense", "config": {"kernel_initializer": {"class_name": "VarianceScaling", "config": {"distribution": "uniform", "scale": 1.0, "seed": null, "mode": "fan_avg"}}, "name": "dense_4", "kernel_constraint": null, "bias_regularizer": null, "bias_constraint": null, "dtype": "float32", "activation": "relu", "trainable": true, "kernel_regularizer": null, "bias_initializer": {"class_name": "Zeros", "config": {}}, "units": 10, "batch_input_shape": [null, 4], "use_bias": true, "activity_regularizer": null}}, {"class_name": "Dense", "config": {"kernel_initializer": {"class_name": "VarianceScaling", "config": {"distribution": "uniform", "scale": 1.0, "seed": null, "mode": "fan_avg"}}, "name": "dense_5", "kernel_constraint": null, "bias_regularizer": null, "bias_constraint": null, "activation": "relu", "trainable": true, "kernel_regularizer": null, "bias_initializer": {"class_name": "Zeros", "config": {}}, "units": 10, "use_bias": true, "activity_regularizer": null}}, {"class_name": "Dense", "config": {"kernel_initializer": {"class_name": "VarianceScaling", "config": {"distribution": "uniform", "scale": 1.0, "seed": null, "mode": "fan_avg"}}, "name": "dense_6", "kernel_constraint": null, "bias_regularizer": null, "bias_constraint": null, "activation": "relu", "trainable": true, "kernel_regularizer": null, "bias_initializer": {"class_name": "Zeros", "config": {}}, "units": 10, "use_bias": true, "activity_regularizer": null}}, {"class_name": "Dense", "config": {"kernel_initializer": {"class_name": "VarianceScaling", "config": {"distribution": "uniform", "scale": 1.0, "seed": null, "mode": "fan_avg"}}, "name": "dense_7", "kernel_constraint": null, "bias_regularizer": null, "bias_constraint": null, "activation": "softmax", "trainable": true, "kernel_regularizer": null, "bias_initializer": {"class_name": "Zeros", "config": {}}, "units": 3, "use_bias": true, "activity_regularizer": null}}], "backend": "tensorflow"}'


# ---- running a documented example -------------------------------------------------------------

@dataclass
class Output:
    """What a statement returned: its column names and rows."""
    columns: list[str]
    rows: list[tuple]

    def dicts(self) -> list[dict]:
        return [dict(zip(self.columns, row)) for row in self.rows]

    def one(self) -> dict:
        assert len(self.rows) == 1, self.rows
        return self.dicts()[0]

    def column(self, name: str) -> list:
        index = self.columns.index(name)
        return [row[index] for row in self.rows]


@dataclass
class Example:
    """One documented example run statement by statement, in order, on `conn`.

    `run(step, *statements)` keeps the output of the step's last statement (the doc's
    `SELECT * FROM ...`), or the statement that failed and its error."""
    conn: psycopg.Connection
    outputs: dict = field(default_factory=dict)
    failures: dict = field(default_factory=dict)

    def run(self, step: str, *statements: str, params: tuple | None = None) -> None:
        output = None
        for statement in statements:
            try:
                cursor = self.conn.execute(statement, params if statement is statements[-1] else None)
            except psycopg.Error as error:
                self.failures[step] = (statement, error)
                return
            output = (Output([c.name for c in cursor.description], cursor.fetchall())
                      if cursor.description is not None else None)
        self.outputs[step] = output

    def __getitem__(self, step: str) -> Output:
        if step in self.failures:  # the statement's error again, of its class (SQLSTATE)
            statement, error = self.failures[step]
            raise type(error)(f"documented statement failed:\n{statement.strip()}\n"
                              f"-> {type(error).__name__}: {str(error).strip()}") from None
        return self.outputs[step]


def _iris_insert() -> str:
    """The doc's step 1 INSERT with its 150 rows (ids 1-150, 50 per class in this order),
    generated from scikit-learn's copy of the UCI iris data."""
    from sklearn.datasets import load_iris

    iris = load_iris()
    rows = ",\n".join(
        f"({i},ARRAY[{','.join(f'{v:.1f}' for v in x)}],'Iris-{iris.target_names[y]}')"
        for i, (x, y) in enumerate(zip(iris.data, iris.target), start=1))
    return f"INSERT INTO iris_data(id, attributes, class_text) VALUES\n{rows};"


def _predict(model: str, output: str, pred_type: str, *more: str) -> str:
    """madlib_keras_predict on the doc's iris_test with a pred_type literal as written in SQL."""
    rest = "".join(f",\n                                   {m}" for m in more)
    return f"""
SELECT madlib_mop.madlib_keras_predict('{model}',
                                   'iris_test',
                                   'id',
                                   'attributes',
                                   '{output}',
                                   {pred_type}{rest}
                                   );"""


# ---- 4.1 madlib_keras.sql_in "Examples" -> "Classification" -----------------------------------

def classification(conn) -> Example:
    ex = Example(conn)
    # Step 1. Create an input data set.
    ex.run("iris_data", """
DROP TABLE IF EXISTS iris_data;""", """
CREATE TABLE iris_data(
    id serial,
    attributes numeric[],
    class_text varchar
);""", _iris_insert(), "SELECT COUNT(*) FROM iris_data;")
    # The doc splits with madlib.train_test_split (setseed(0), 0.8 train, separate output
    # tables), which this extension does not have: plain SQL makes the same two tables, same
    # columns and sizes (120 train, 30 test = every 5th id, 10 per class), deterministically.
    ex.run("split", """
DROP TABLE IF EXISTS iris_train, iris_test;""", """
CREATE TABLE iris_train AS SELECT * FROM iris_data WHERE id % 5 <> 0;""", """
CREATE TABLE iris_test AS SELECT * FROM iris_data WHERE id % 5 = 0;""", """
SELECT COUNT(*) FROM iris_train;""")
    ex.run("test_count", "SELECT COUNT(*) FROM iris_test;")

    # Step 2. Call the preprocessor for deep learning.
    ex.run("train_packed_summary", """
DROP TABLE IF EXISTS iris_train_packed, iris_train_packed_summary;""", """
SELECT madlib_mop.training_preprocessor_dl('iris_train',         -- Source table
                                       'iris_train_packed',  -- Output table
                                       'class_text',         -- Dependent variable
                                       'attributes'          -- Independent variable
                                        );""", """
SELECT * FROM iris_train_packed_summary;""")
    ex.run("train_packed", "SELECT * FROM iris_train_packed ORDER BY buffer_id;")
    ex.run("test_packed_summary", """
DROP TABLE IF EXISTS iris_test_packed, iris_test_packed_summary;""", """
SELECT madlib_mop.validation_preprocessor_dl('iris_test',          -- Source table
                                         'iris_test_packed',   -- Output table
                                         'class_text',         -- Dependent variable
                                         'attributes',         -- Independent variable
                                         'iris_train_packed'   -- From training preprocessor step
                                          );""", """
SELECT * FROM iris_test_packed_summary;""")
    ex.run("test_packed", "SELECT * FROM iris_test_packed ORDER BY buffer_id;")

    # Step 3. Define and load model architecture.
    ex.run("arch", """
DROP TABLE IF EXISTS model_arch_library;""", f"""
SELECT madlib_mop.load_keras_model('model_arch_library',  -- Output table,
$$
{MODEL_SIMPLE_JSON}
$$
::json,  -- JSON blob
                               NULL,                  -- Weights
                               'Sophie',              -- Name
                               'A simple model'       -- Descr
);""", "SELECT * FROM model_arch_library ORDER BY model_id;")

    # Step 4. Train model and view summary table (the doc's parameters: 10 iterations of
    # epochs=3, batch_size=5 on 120 rows are fast).
    ex.run("fit_summary", """
DROP TABLE IF EXISTS iris_model, iris_model_summary;""", """
SELECT madlib_mop.madlib_keras_fit('iris_train_packed',   -- source table
                               'iris_model',          -- model output table
                               'model_arch_library',  -- model arch table
                                1,                    -- model arch id
                                $$ loss='categorical_crossentropy', optimizer='adam', metrics=['categorical_accuracy'] $$,  -- compile_params
                                $$ batch_size=5, epochs=3 $$,  -- fit_params
                                10                    -- num_iterations
                              );""", """
SELECT * FROM iris_model_summary;""")
    ex.run("fit_model", "SELECT * FROM iris_model;")

    # Step 5. Evaluate.
    ex.run("evaluate", """
DROP TABLE IF EXISTS iris_validate;""", """
SELECT madlib_mop.madlib_keras_evaluate('iris_model',       -- model
                                   'iris_test_packed',  -- test table
                                   'iris_validate'      -- output table
                                   );""", """
SELECT * FROM iris_validate;""")

    # Step 6. Predict (default pred_type, i.e. 'prob').
    ex.run("predict", """
DROP TABLE IF EXISTS iris_predict;""", """
SELECT madlib_mop.madlib_keras_predict('iris_model', -- model
                                   'iris_test',  -- test_table
                                   'id',  -- id column
                                   'attributes', -- independent var
                                   'iris_predict'  -- output table
                                   );""", """
SELECT * FROM iris_predict ORDER BY id, rank;""")
    ex.run("predict_misclassified", """
SELECT COUNT(*) FROM iris_predict JOIN iris_test USING (id)
WHERE iris_predict.class_value != iris_test.class_text AND iris_predict.rank = 1;""")
    ex.run("predict_accuracy", """
SELECT round(count(*)*100/(150*0.2),2) as test_accuracy_percent from
    (select iris_test.class_text as actual, iris_predict.class_value as estimated
     from iris_predict inner join iris_test
     on iris_test.id=iris_predict.id where iris_predict.rank = 1) q
WHERE q.actual=q.estimated;""")

    # pred_type usages of MADlib's own test suite (madlib_keras_predict.sql_in,
    # madlib_keras_multi_io.sql_in: no doc example has them), on this example's model: 'response',
    # NULL (-> 'prob'), the INTEGER overload (top k) and the DOUBLE PRECISION one (threshold).
    for output, pred_type, more in (("iris_predict_response", "'response'", ("FALSE",)),
                                    ("iris_predict_null", "NULL", ("FALSE",)),
                                    ("iris_predict_top2", "2", ("FALSE",)),
                                    ("iris_predict_top2_short", "2", ()),
                                    ("iris_predict_threshold", "0.5", ("FALSE",)),
                                    ("iris_predict_threshold_short", "0.5", ())):
        ex.run(output, f"DROP TABLE IF EXISTS {output};", _predict("iris_model", output, pred_type, *more),
               f"SELECT * FROM {output} ORDER BY id;")

    # Step 7. Predict BYOM, with the weights of the model trained above.
    ex.run("byom_weights", """
UPDATE model_arch_library
SET model_weights = iris_model.model_weights
FROM iris_model
WHERE model_arch_library.model_id = 1;""", """
SELECT (a.model_weights = m.model_weights) AS same FROM model_arch_library a, iris_model m
WHERE a.model_id = 1;""")
    ex.run("byom", """
DROP TABLE IF EXISTS iris_predict_byom;""", """
SELECT madlib_mop.madlib_keras_predict_byom('model_arch_library',  -- model arch table
                                         1,                    -- model arch id
                                        'iris_test',           -- test_table
                                        'id',                  -- id column
                                        'attributes',          -- independent var
                                        'iris_predict_byom',   -- output table
                                        'response',            -- prediction type
                                         FALSE,                -- use GPUs
                                         ARRAY[ARRAY['Iris-setosa', 'Iris-versicolor', 'Iris-virginica']], -- class values
                                         1.0                   -- normalizing const
                                   );""", """
SELECT * FROM iris_predict_byom ORDER BY id;""")
    ex.run("byom_misclassified", """
SELECT COUNT(*) FROM iris_predict_byom JOIN iris_test USING (id)
WHERE iris_predict_byom.class_value != iris_test.class_text;""")
    ex.run("byom_accuracy", """
SELECT round(count(*)*100/(150*0.2),2) as test_accuracy_percent from
    (select iris_test.class_text as actual, iris_predict_byom.class_value as estimated
     from iris_predict_byom inner join iris_test
     on iris_test.id=iris_predict_byom.id) q
WHERE q.actual=q.estimated;""")

    # predict_byom as MADlib's test suite calls it (madlib_keras_predict_byom.sql_in): without
    # class values (class_value '0', '1', '2'); 'prob' with class values and 1.0; and with the
    # 11th argument dependent_count => 1 given positionally.  Plus the INTEGER and DOUBLE
    # PRECISION pred_type overloads.
    byom_calls = {
        "byom_no_class_values": "",
        "byom_prob": """,
                                 'prob',
                                 NULL,
                                 ARRAY[ARRAY['Iris-setosa', 'Iris-versicolor',
                                  'Iris-virginica']::text[]],
                                 1.0""",
        "byom_dependent_count": """,
                                 'prob',
                                 NULL,
                                 ARRAY[ARRAY['Iris-setosa', 'Iris-versicolor',
                                  'Iris-virginica']::text[]],
                                 1.0,
                                 1""",
        "byom_top2": """,
                                 2,
                                 FALSE,
                                 ARRAY[ARRAY['Iris-setosa', 'Iris-versicolor',
                                  'Iris-virginica']::text[]],
                                 1.0""",
        "byom_threshold": """,
                                 0.5,
                                 FALSE,
                                 ARRAY[ARRAY['Iris-setosa', 'Iris-versicolor',
                                  'Iris-virginica']::text[]],
                                 1.0""",
    }
    for step, more in byom_calls.items():
        ex.run(step, f"DROP TABLE IF EXISTS {step};", f"""
SELECT madlib_mop.madlib_keras_predict_byom(
                                 'model_arch_library',
                                 1,
                                 'iris_test',
                                 'id',
                                 'attributes',
                                 '{step}'{more}
                                 );""", f"SELECT * FROM {step} ORDER BY id;")
    ex.run("iris_test", "SELECT * FROM iris_test ORDER BY id;")
    return ex


# ---- 4.2 madlib_keras.sql_in "Classification with Other Parameters" ---------------------------

def other_parameters(classification) -> Example:
    ex = Example(classification.conn)
    # Validation dataset and metrics every 3rd iteration.  (model_arch_library's model 1 holds
    # the weights step 7 put there, so this fit starts from them, as it does in MADlib.)
    ex.run("fit_summary", """
DROP TABLE IF EXISTS iris_model, iris_model_summary;""", """
SELECT madlib_mop.madlib_keras_fit('iris_train_packed',   -- source table
                               'iris_model',          -- model output table
                               'model_arch_library',  -- model arch table
                                1,                    -- model arch id
                                $$ loss='categorical_crossentropy', optimizer='adam', metrics=['categorical_accuracy'] $$,  -- compile_params
                                $$ batch_size=5, epochs=3 $$,  -- fit_params
                                10,                   -- num_iterations
                                FALSE,                -- use GPUs
                                'iris_test_packed',   -- validation dataset
                                3,                    -- metrics compute frequency
                                FALSE,                -- warm start
                               'Sophie L.',           -- name
                               'Simple MLP for iris dataset'  -- description
                              );""", """
SELECT * FROM iris_model_summary;""")
    # Predict probabilities for each class.
    ex.run("predict", """
DROP TABLE IF EXISTS iris_predict;""", """
SELECT madlib_mop.madlib_keras_predict('iris_model',      -- model
                                   'iris_test',       -- test_table
                                   'id',              -- id column
                                   'attributes',      -- independent var
                                   'iris_predict',    -- output table
                                   'prob'             -- response type
                                   );""", """
SELECT * FROM iris_predict ORDER BY id;""")
    # Warm start: the model tables are not dropped.
    ex.run("warm_summary", """
SELECT madlib_mop.madlib_keras_fit('iris_train_packed',   -- source table
                               'iris_model',          -- model output table
                               'model_arch_library',  -- model arch table
                                1,                    -- model arch id
                                $$ loss='categorical_crossentropy', optimizer='adam', metrics=['categorical_accuracy'] $$,  -- compile_params
                                $$ batch_size=5, epochs=3 $$,  -- fit_params
                                5,                   -- num_iterations
                                FALSE,               -- use GPUs
                                'iris_test_packed',   -- validation dataset
                                1,                    -- metrics compute frequency
                                TRUE,                 -- warm start
                               'Sophie L.',           -- name
                               'Simple MLP for iris dataset'  -- description
                              );""", """
SELECT * FROM iris_model_summary;""")
    # Transfer learning: the first hidden layer frozen, initial weights from the run above.
    ex.run("transfer_arch", f"""
SELECT madlib_mop.load_keras_model('model_arch_library',  -- Output table,
$$
{MODEL_TRANSFER_JSON}
$$
::json,  -- JSON blob
                               NULL,                  -- Weights
                               'Maria',               -- Name
                               'A transfer model'     -- Descr
);""", """
UPDATE model_arch_library
SET model_weights = iris_model.model_weights
FROM iris_model
WHERE model_arch_library.model_id = 2;""", """
SELECT * FROM model_arch_library ORDER BY model_id;""")
    ex.run("transfer_summary", """
DROP TABLE IF EXISTS iris_model, iris_model_summary;""", """
SELECT madlib_mop.madlib_keras_fit('iris_train_packed',   -- source table
                               'iris_model',          -- model output table
                               'model_arch_library',  -- model arch table
                                2,                    -- model arch id
                                $$ loss='categorical_crossentropy', optimizer='adam', metrics=['categorical_accuracy'] $$,  -- compile_params
                                $$ batch_size=5, epochs=3 $$,  -- fit_params
                                10                    -- num_iterations
                              );""", """
SELECT * FROM iris_model_summary;""")
    ex.run("transfer_model", "SELECT * FROM iris_model;")
    return ex


# ---- 4.3 keras_model_arch_table.sql_in: load_keras_model examples -----------------------------

def arch_table(other_parameters) -> Example:
    ex = Example(other_parameters.conn)
    load = f"""
SELECT madlib_mop.load_keras_model('model_arch_library',  -- Output table,
$$
{MODEL_SIMPLE_JSON}
$$
::json,  -- JSON blob
                               NULL,                  -- Weights
                               %s,              -- Name
                               %s       -- Descr
);"""
    listing = ("SELECT model_id, name, description, (model_weights IS NOT NULL) AS has_model_weights "
               "FROM model_arch_library ORDER BY model_id;")
    ex.run("count1", "DROP TABLE IF EXISTS model_arch_library;",
           load % ("'Sophie'", "'A simple model'"), "SELECT COUNT(*) FROM model_arch_library;")
    ex.run("count2", load % ("'Maria'", "'Also a simple model'"), "SELECT COUNT(*) FROM model_arch_library;")
    # 3. Load model weights from a previous MADlib run (the doc's statement, as written).
    ex.run("weights", """
UPDATE model_arch_library SET model_weights = model_weights FROM iris_model WHERE model_id = 2;""",
           listing)
    # 4. Load weights from Keras with a PL/Python function (the doc's `\\#` are `#`).
    ex.run("plpython", """
CREATE OR REPLACE FUNCTION load_weights() RETURNS VOID AS
$$
import keras
from tensorflow.keras.layers import *
from tensorflow.keras import Sequential
import numpy as np
import plpy
#
# create model
model = Sequential()
model.add(Dense(10, activation='relu', input_shape=(4,)))
model.add(Dense(10, activation='relu'))
model.add(Dense(3, activation='softmax'))
#
# get weights, flatten and serialize
weights = model.get_weights()
weights_flat = [w.flatten() for w in weights]
weights1d =  np.concatenate(weights_flat).ravel()
weights_bytea = weights1d.tostring()
#
# load query
load_query = plpy.prepare(\"\"\"SELECT madlib_mop.load_keras_model(
                        'model_arch_library',
                        $1, $2)
                    \"\"\", ['json','bytea'])
plpy.execute(load_query, [model.to_json(), weights_bytea])
$$ language plpython3u;""", "SELECT load_weights();", listing)
    # 5. Load weights from Keras with a Python client: the doc's psycopg2 code, with psycopg
    # (this project's driver) and NumPy 2's tobytes() for the doc's tostring().
    import numpy as np
    from tensorflow.keras import Sequential
    from tensorflow.keras.layers import Dense

    model = Sequential()
    model.add(Dense(10, activation='relu', input_shape=(4,)))
    model.add(Dense(10, activation='relu'))
    model.add(Dense(3, activation='softmax'))
    weights = model.get_weights()
    weights_flat = [w.flatten() for w in weights]
    weights1d = np.concatenate(weights_flat).ravel()
    weights_bytea = weights1d.tobytes()
    query = "SELECT madlib_mop.load_keras_model('model_arch_library', %s,%s)"
    ex.run("before_client", listing)
    ex.run("client", query, params=(model.to_json(), weights_bytea))
    ex.run("client_listing", listing)
    # 6. Delete one of the models.
    ex.run("delete", """
SELECT madlib_mop.delete_keras_model('model_arch_library',   -- Output table
                                  1                      -- Model id
                                );""", listing)
    return ex


# ---- 4.7 madlib_keras_model_selection.sql_in: generate_model_configs, load_model_selection_table

def _load_two_models(ex: Example) -> None:
    """Model selection step 2 (also fit multiple step 3): both architectures, no weights."""
    ex.run("arch", """
DROP TABLE IF EXISTS model_arch_library;""", f"""
SELECT madlib_mop.load_keras_model('model_arch_library',  -- Output table,
$$
{MODEL_SIMPLE_JSON}
$$
::json,         -- JSON blob
                               NULL,                  -- Weights
                               'Sophie',              -- Name
                               'MLP with 1 hidden layer'       -- Descr
);""", f"""
SELECT madlib_mop.load_keras_model('model_arch_library',  -- Output table,
$$
{MODEL2_JSON}
$$
::json,         -- JSON blob
                               NULL,                  -- Weights
                               'Maria',               -- Name
                               'MLP with 2 hidden layers'       -- Descr
);""", """
SELECT model_id, name, description FROM model_arch_library ORDER BY model_id;""")


GRID = """
SELECT madlib_mop.generate_model_configs(
                                        'model_arch_library', -- model architecture table
                                        'mst_table',          -- model selection table output
                                         ARRAY[1,2],          -- model ids from model architecture table
                                         $$
                                            {'loss': ['categorical_crossentropy'],
                                             'optimizer_params_list': [ {'optimizer': ['Adam', 'SGD'], 'lr': [0.001, 0.01]} ],
                                             'metrics': ['accuracy']}
                                         $$,                  -- compile_param_grid
                                         $$
                                         { 'batch_size': [64, 128],
                                           'epochs': [10]
                                         }
                                         $$,                  -- fit_param_grid
                                         'grid'               -- search_type
                                         );"""
RANDOM = """
SELECT madlib_mop.generate_model_configs(
                                        'model_arch_library', -- model architecture table
                                        'mst_table',          -- model selection table output
                                         ARRAY[1,2],          -- model ids from model architecture table
                                         $$
                                            {'loss': ['categorical_crossentropy'],
                                             'optimizer_params_list': [
                                                 {'optimizer': ['SGD'], 'lr': [0.0001, 0.001, 'log'], 'momentum': [0.95, 0.99, 'log_near_one']},
                                                 {'optimizer': ['Adam'], 'lr': [0.01, 0.1, 'log'], 'decay': [1e-6, 1e-4, 'log']}],
                                             'metrics': ['accuracy']}
                                         $$,                  -- compile_param_grid
                                         $$
                                         { 'batch_size': [64, 128],
                                           'epochs': [10]
                                         }
                                         $$,                  -- fit_param_grid
                                         'random',            -- search_type
                                         20
                                         );"""
DROP_MST = "DROP TABLE IF EXISTS mst_table, mst_table_summary;"
SELECT_MST = "SELECT * FROM mst_table ORDER BY mst_key;"


def model_selection(arch_table) -> Example:
    ex = Example(arch_table.conn)
    _load_two_models(ex)
    # 3. Grid search.
    ex.run("grid", DROP_MST, GRID, SELECT_MST)
    ex.run("grid_summary", "SELECT * FROM mst_table_summary;")
    # Different parameters per optimizer.
    ex.run("per_optimizer", DROP_MST, """
SELECT madlib_mop.generate_model_configs(
                                        'model_arch_library', -- model architecture table
                                        'mst_table',          -- model selection table output
                                         ARRAY[1,2],          -- model ids from model architecture table
                                         $$
                                            {'loss': ['categorical_crossentropy'],
                                             'optimizer_params_list': [
                                                 {'optimizer': ['SGD']},
                                                 {'optimizer': ['SGD'], 'lr': [0.0001, 0.001], 'momentum': [0.95]},
                                                 {'optimizer': ['Adam'], 'lr': [0.01, 0.1], 'decay': [1e-4]}],
                                             'metrics': ['accuracy']}
                                         $$,                  -- compile_param_grid
                                         $$
                                         { 'batch_size': [64, 128],
                                           'epochs': [10]
                                         }
                                         $$,                  -- fit_param_grid
                                         'grid'               -- search_type
                                         );""", SELECT_MST)
    # 4. Random search.
    ex.run("random", DROP_MST, RANDOM, SELECT_MST)
    # 5. Incremental loading: the grid, then (not dropping) the random search.
    ex.run("incremental", DROP_MST, GRID, RANDOM, SELECT_MST)
    # 6. (a model selection table made by hand: plain SQL, none of MADlib's functions) and
    # 7. (custom loss and metric functions: generate_model_configs with object table
    # 'custom_function_table', loaded by load_custom_function / load_top_k_accuracy_function,
    # which this extension refuses on purpose -- see tests/test_madlib_compat.py) are left out.
    # 8. [Deprecated] load_model_selection_table.
    ex.run("load_mst", DROP_MST, """
SELECT madlib_mop.load_model_selection_table('model_arch_library', -- model architecture table
                                         'mst_table',          -- model selection table output
                                          ARRAY[1,2],              -- model ids from model architecture table
                                          ARRAY[                   -- compile params
                                              $$loss='categorical_crossentropy',optimizer='Adam(lr=0.1)',metrics=['categorical_accuracy']$$,
                                              $$loss='categorical_crossentropy', optimizer='Adam(lr=0.01)',metrics=['categorical_accuracy']$$,
                                              $$loss='categorical_crossentropy',optimizer='Adam(lr=0.001)',metrics=['categorical_accuracy']$$
                                          ],
                                          ARRAY[                    -- fit params
                                              $$batch_size=4,epochs=1$$,
                                              $$batch_size=8,epochs=1$$
                                          ]
                                         );""", SELECT_MST)
    ex.run("load_mst_summary", "SELECT * FROM mst_table_summary;")
    return ex


# ---- 4.8 madlib_keras_fit_multiple_model.sql_in ------------------------------------------------

def fit_multiple(model_selection) -> Example:
    ex = Example(model_selection.conn)
    # Step 1 is 4.1's data (iris_data, iris_train, iris_test: still here).  Step 2.
    ex.run("train_packed_summary", """
DROP TABLE IF EXISTS iris_train_packed, iris_train_packed_summary;""", """
SELECT madlib_mop.training_preprocessor_dl('iris_train',         -- Source table
                                       'iris_train_packed',  -- Output table
                                       'class_text',         -- Dependent variable
                                       'attributes'          -- Independent variable
                                        );""", """
SELECT * FROM iris_train_packed_summary;""")
    ex.run("test_packed_summary", """
DROP TABLE IF EXISTS iris_test_packed, iris_test_packed_summary;""", """
SELECT madlib_mop.validation_preprocessor_dl('iris_test',          -- Source table
                                         'iris_test_packed',   -- Output table
                                         'class_text',         -- Dependent variable
                                         'attributes',         -- Independent variable
                                         'iris_train_packed'   -- From training preprocessor step
                                          );""", """
SELECT * FROM iris_test_packed_summary;""")
    # Step 3.
    _load_two_models(ex)
    # Step 4. Grid search.
    ex.run("mst", DROP_MST, """
SELECT madlib_mop.generate_model_configs(
                                        'model_arch_library', -- model architecture table
                                        'mst_table',          -- model selection table output
                                         ARRAY[1,2],          -- model ids from model architecture table
                                         $$
                                            {'loss': ['categorical_crossentropy'],
                                             'optimizer_params_list': [ {'optimizer': ['Adam'], 'lr': [0.001, 0.01, 0.1]} ],
                                             'metrics': ['accuracy']}
                                         $$,                  -- compile_param_grid
                                         $$
                                         { 'batch_size': [4, 8],
                                           'epochs': [1]
                                         }
                                         $$,                  -- fit_param_grid
                                         'grid'               -- search_type
                                         );""", SELECT_MST)
    ex.run("mst_summary", "SELECT * FROM mst_table_summary;")
    # Step 5. Train multiple models.
    ex.run("summary", """
DROP TABLE IF EXISTS iris_multi_model, iris_multi_model_summary, iris_multi_model_info;""", """
SELECT madlib_mop.madlib_keras_fit_multiple_model('iris_train_packed',    -- source_table
                                              'iris_multi_model',     -- model_output_table
                                              'mst_table',            -- model_selection_table
                                              10,                     -- num_iterations
                                              FALSE                   -- use gpus
                                             );""", """
SELECT * FROM iris_multi_model_summary;""")
    ex.run("info", "SELECT * FROM iris_multi_model_info ORDER BY training_metrics_final DESC, training_loss_final;")
    ex.run("models", "SELECT * FROM iris_multi_model ORDER BY mst_key;")
    # Step 6. Evaluate (with mst_key).
    ex.run("evaluate", """
DROP TABLE IF EXISTS iris_validate;""", """
SELECT madlib_mop.madlib_keras_evaluate('iris_multi_model',  -- model
                                    'iris_test_packed',  -- test table
                                    'iris_validate',     -- output table
                                     NULL,               -- use gpus
                                     3                   -- mst_key to use
                                   );""", """
SELECT * FROM iris_validate;""")
    # Step 7. Predict 'response' with mst_key.
    ex.run("predict", """
DROP TABLE IF EXISTS iris_predict;""", """
SELECT madlib_mop.madlib_keras_predict('iris_multi_model', -- model
                                   'iris_test',        -- test_table
                                   'id',               -- id column
                                   'attributes',       -- independent var
                                   'iris_predict',     -- output table
                                    'response',        -- prediction type
                                    FALSE,             -- use gpus
                                    3                  -- mst_key to use
                                   );""", """
SELECT * FROM iris_predict ORDER BY id;""")
    ex.run("misclassified", """
SELECT COUNT(*) FROM iris_predict JOIN iris_test USING (id)
WHERE iris_predict.class_value != iris_test.class_text;""")
    ex.run("accuracy", """
SELECT round(count(*)*100/(150*0.2),2) as test_accuracy_percent from
    (select iris_test.class_text as actual, iris_predict.class_value as estimated
     from iris_predict inner join iris_test
     on iris_test.id=iris_predict.id) q
WHERE q.actual=q.estimated;""")
    # Other parameters: validation, metrics every 3rd iteration, caching.
    ex.run("other_summary", """
DROP TABLE IF EXISTS iris_multi_model, iris_multi_model_summary, iris_multi_model_info;""", """
SELECT madlib_mop.madlib_keras_fit_multiple_model('iris_train_packed',    -- source_table
                                              'iris_multi_model',     -- model_output_table
                                              'mst_table',            -- model_selection_table
                                               10,                     -- num_iterations
                                               FALSE,                 -- use gpus
                                              'iris_test_packed',     -- validation dataset
                                               3,                     -- metrics compute frequency
                                               FALSE,                 -- warm start
                                              'Sophie L.',            -- name
                                              'Model selection for iris dataset',  -- description
                                               TRUE                   -- use caching
                                             );""", """
SELECT * FROM iris_multi_model_summary;""")
    ex.run("other_info", "SELECT * FROM iris_multi_model_info ORDER BY training_metrics_final DESC, training_loss_final;")
    ex.run("other_predict", """
DROP TABLE IF EXISTS iris_predict;""", """
SELECT madlib_mop.madlib_keras_predict('iris_multi_model', -- model
                                   'iris_test',        -- test_table
                                   'id',               -- id column
                                   'attributes',       -- independent var
                                   'iris_predict',     -- output table
                                    'prob',            -- prediction type
                                    FALSE,             -- use gpus
                                    3                  -- mst_key to use
                                   );""", """
SELECT * FROM iris_predict ORDER BY id, rank;""")
    # Warm start.
    ex.run("warm_summary", """
SELECT madlib_mop.madlib_keras_fit_multiple_model('iris_train_packed',    -- source_table
                                              'iris_multi_model',     -- model_output_table
                                              'mst_table',            -- model_selection_table
                                               3,                     -- num_iterations
                                               FALSE,                 -- use gpus
                                              'iris_test_packed',     -- validation dataset
                                               1,                     -- metrics compute frequency
                                               TRUE,                  -- warm start
                                              'Sophie L.',            -- name
                                              'Simple MLP for iris dataset',  -- description
                                               TRUE                   -- use caching
                                             );""", """
SELECT * FROM iris_multi_model_summary;""")
    ex.run("warm_info", "SELECT * FROM iris_multi_model_info ORDER BY training_metrics_final DESC, training_loss_final;")
    return ex
