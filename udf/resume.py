from madlib_mop.fit import resume
from madlib_mop.plpy_bridge import run

run(plpy, resume, job_id, can_commit=True)
