from madlib_mop.api.model_catalog import delete_keras_model
from madlib_mop.plpy_bridge import run

run(plpy, delete_keras_model, keras_model_arch_table, model_id)
