from madlib_mop.api.deployments import rollback_model
from madlib_mop.plpy_bridge import run

return run(plpy, rollback_model, name)
