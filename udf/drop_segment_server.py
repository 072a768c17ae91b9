from madlib_mop.plpy_bridge import run
from madlib_mop.api.cluster import drop_segment_server

run(plpy, drop_segment_server, server_name)
