from madlib_mop.api.custom_functions import load_top_k_accuracy_function
from madlib_mop.plpy_bridge import run

run(plpy, load_top_k_accuracy_function, object_table, k)
