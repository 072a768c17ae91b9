import json

from madlib_mop.plpy_bridge import run
from madlib_mop.segment.worker import ship

run(plpy, ship, json.loads(job))
