from madlib_mop.api.model_catalog import load_keras_model
from madlib_mop.plpy_bridge import run

run(plpy, load_keras_model, keras_model_arch_table, model_arch, model_weights, name, description)
