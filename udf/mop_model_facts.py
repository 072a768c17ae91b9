from madlib_mop.plpy_bridge import run
from madlib_mop.segment.keras_work import model_facts

return run(plpy, model_facts, request)
