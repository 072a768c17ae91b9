/* Worker sessions kept ready for named roles (prewarm.c). */
#ifndef MADLIB_MOP_PREWARM_H
#define MADLIB_MOP_PREWARM_H

/* From _PG_init: madlib_mop.prewarm_roles and madlib_mop.prewarm_sessions. */
extern void prewarm_define_settings(void);

/* From _PG_init while shared_preload_libraries loads: the launcher's background worker. */
extern void prewarm_register_launcher(void);

#endif
