from madlib_mop.plpy_bridge import run
from madlib_mop.segment.worker import trace_latest_job

return run(plpy, trace_latest_job)
