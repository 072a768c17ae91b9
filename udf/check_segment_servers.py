from madlib_mop.plpy_bridge import run
from madlib_mop.api.cluster import check_segment_servers

return run(plpy, check_segment_servers)
