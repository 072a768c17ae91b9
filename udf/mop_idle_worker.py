from madlib_mop.plpy_bridge import run
from madlib_mop.engine.server_slots import idle

run(plpy, idle, seconds, can_commit=CAN_COMMIT)
