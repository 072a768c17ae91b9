from madlib_mop.plpy_bridge import run
from madlib_mop.api.segment_servers import add_segment_server

run(plpy, add_segment_server, server_name, host, port, dbname, segments)
