from madlib_mop.api.transfer import materialize_features
from madlib_mop.plpy_bridge import run

run(plpy, materialize_features, model_table, source_table, output_table, layer, mst_key)
