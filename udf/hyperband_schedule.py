from madlib_mop.api.automl import hyperband_schedule
from madlib_mop.plpy_bridge import run

run(plpy, hyperband_schedule, schedule_table, r, eta, skip_last)
