from madlib_mop.plpy_bridge import run
from madlib_mop.segment.keras_work import initial_states

return run(plpy, initial_states, request, weights, token)
