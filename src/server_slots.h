/* The worker pool's slots and queue in shared memory (server_slots.c). */
#ifndef MADLIB_MOP_SERVER_SLOTS_H
#define MADLIB_MOP_SERVER_SLOTS_H

/* The highest madlib_mop.max_worker_sessions, and the queue's places. */
#define MAX_WORKER_SESSIONS 10000

/* From _PG_init while shared_preload_libraries loads: request and set up shared memory. */
extern void server_slots_init(void);

#endif
