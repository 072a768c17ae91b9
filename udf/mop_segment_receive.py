from madlib_mop.plpy_bridge import run
from madlib_mop.segment.kept_states import receive

return run(plpy, receive, job_id, mst_key, step, piece, at_byte, last)
