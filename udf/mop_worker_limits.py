import json

from madlib_mop.job.memory import limits_here
from madlib_mop.plpy_bridge import run

return json.dumps(run(plpy, limits_here).as_json())
