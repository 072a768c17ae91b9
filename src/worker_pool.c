/*
 * Settings of the server's pool of worker sessions that only a superuser may change.
 *
 * madlib_mop.max_worker_sessions caps the worker sessions (busy and idle together) of
 * every job and role.  Declared here as a PGC_SUSET variable, so that SET by another role
 * is refused ("permission denied to set parameter"), and a value such a role set before
 * this library was loaded in its session is dropped with a WARNING when it is loaded.
 * 0, the default, means "from the machine" (madlib_mop.engine.server_pool.machine_cap).
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/guc.h"

void		_PG_init(void);

static int	max_worker_sessions = 0;

void
_PG_init(void)
{
	DefineCustomIntVariable("madlib_mop.max_worker_sessions",
							"Live worker sessions (busy and idle) of madlib_mop jobs, evaluations "
							"and predictions, all roles together; 0: from the machine's cores and memory.",
							NULL,
							&max_worker_sessions,
							0, 0, 10000,
							PGC_SUSET,
							0,
							NULL, NULL, NULL);
}

PG_FUNCTION_INFO_V1(madlib_mop_max_worker_sessions);

/* The setting as this session sees it (calling this loads the library, which declares it). */
Datum
madlib_mop_max_worker_sessions(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT32(max_worker_sessions);
}
