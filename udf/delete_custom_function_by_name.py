from madlib_mop.api.custom_functions import delete_custom_function_by_name
from madlib_mop.plpy_bridge import run

run(plpy, delete_custom_function_by_name, object_table, name)
