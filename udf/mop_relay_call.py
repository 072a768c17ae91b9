import json

from madlib_mop.plpy_bridge import run
from madlib_mop.engine.relay import call

values, out = run(plpy, call, function_name, json.loads(arguments), blobs)
return json.dumps(values), out
