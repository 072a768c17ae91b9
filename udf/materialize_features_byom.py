from madlib_mop.api.transfer import materialize_features_byom
from madlib_mop.plpy_bridge import run

run(plpy, materialize_features_byom, model_arch_table, model_id, source_table, output_table, layer)
