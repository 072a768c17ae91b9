from madlib_mop.api.fit import resume
from madlib_mop.plpy_bridge import run

run(plpy, resume, job_id, can_commit=CAN_COMMIT)
