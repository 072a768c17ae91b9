from madlib_mop.api.custom_functions import delete_custom_function
from madlib_mop.plpy_bridge import run

run(plpy, delete_custom_function, object_table, id)
