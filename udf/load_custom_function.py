from madlib_mop.api.custom_functions import load_custom_function
from madlib_mop.plpy_bridge import run

run(plpy, load_custom_function, object_table, object, name, description)
