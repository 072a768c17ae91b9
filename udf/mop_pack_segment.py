from madlib_mop.plpy_bridge import run
from madlib_mop.segment.pack import pack_segment

return run(plpy, pack_segment, task)
