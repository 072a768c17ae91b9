from madlib_mop.api.transfer import load_transfer_model
from madlib_mop.plpy_bridge import run

return run(plpy, load_transfer_model, model_arch_table, base_table, base_id, layer, head, name, description, seed)
