from madlib_mop.plpy_bridge import run
from madlib_mop.api.segment_servers import drop_segment_server

run(plpy, drop_segment_server, server_name)
