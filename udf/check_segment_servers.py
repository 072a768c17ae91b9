from madlib_mop.plpy_bridge import run
from madlib_mop.api.segment_servers import check_segment_servers

return run(plpy, check_segment_servers)
