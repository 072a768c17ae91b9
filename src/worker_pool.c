/*
 * The extension's settings, declared where its library is loaded, and the prefix
 * madlib_mop.* reserved for them.
 *
 * madlib_mop.max_worker_sessions caps the worker sessions (busy and idle together) of
 * every job and role, and, where the library is preloaded, of every database of the server
 * (server_slots.c).  Declared here as a PGC_SUSET variable, so that SET by another role
 * is refused ("permission denied to set parameter"), and a value such a role set before
 * this library was loaded in its session is dropped with a WARNING when it is loaded.
 * 0, the default, means "from the machine" (madlib_mop.engine.server_slots.machine_cap).
 *
 * The others are anyone's, declared as text with an empty default: the extension reads
 * them where it uses them (madlib_mop.db.settings) and refuses a bad value there with its
 * own SQLSTATE and HINT, and an empty value means its documented default, as an unset one
 * did before they were declared.
 *
 * With the prefix reserved, a name of madlib_mop.* that is none of these is an error
 * ("invalid configuration parameter name") once the library is loaded: at SET time where
 * it is preloaded (shared_preload_libraries or session_preload_libraries), else dropped
 * with a WARNING when the session first loads it (the extension's first call).
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "utils/guc.h"

#include "prewarm.h"
#include "server_slots.h"

void		_PG_init(void);

static int	max_worker_sessions = 0;

typedef struct TextSetting
{
	const char *name;
	const char *description;
	char	   *value;
} TextSetting;

/* Every setting of the extension but max_worker_sessions (README, "Settings"). */
static TextSetting text_settings[] = {
	{"madlib_mop.worker_memory_mb",
	 "Memory (MB) a worker session may hold beyond TensorFlow: its models, then decoded buffers; empty: 4096.", NULL},
	{"madlib_mop.worker_idle_seconds",
	 "Seconds a finished call's worker sessions wait, idle, for their role's next call; 0 keeps none; empty: 300.", NULL},
	{"madlib_mop.queue_timeout_seconds",
	 "Seconds a call waits for a worker session before it gives up; empty or 0: no limit.", NULL},
	{"madlib_mop.preprocessor_memory_mb",
	 "Memory (MB) of rows a packing holds at once; a larger table is packed in waves; empty: 1024.", NULL},
	{"madlib_mop.segments",
	 "Segments a packing spreads its buffers over (and predict's parts); empty: the server's CPU count.", NULL},
	{"madlib_mop.stage_frozen_layers",
	 "Whether fits compute frozen first layers once per row and segment; empty: on.", NULL},
	{"madlib_mop.fuse_models",
	 "Whether fits train small models of one architecture as one program: auto, on or off; empty: auto.", NULL},
	{"madlib_mop.segment_wait_seconds",
	 "Seconds a job waits for a segment server that does not answer before it stops; empty: 300.", NULL},
	{"madlib_mop.worker_conninfo",
	 "libpq parameters of how worker sessions connect (connect_timeout, keepalives*, tcp_user_timeout only).", NULL},
};

void
_PG_init(void)
{
	DefineCustomIntVariable("madlib_mop.max_worker_sessions",
							"Live worker sessions (busy and idle) of madlib_mop jobs, evaluations "
							"and predictions, all roles together; 0: from the machine's cores and memory.",
							NULL,
							&max_worker_sessions,
							0, 0, MAX_WORKER_SESSIONS,
							PGC_SUSET,
							0,
							NULL, NULL, NULL);
	for (int i = 0; i < lengthof(text_settings); i++)
		DefineCustomStringVariable(text_settings[i].name,
								   text_settings[i].description,
								   NULL,
								   &text_settings[i].value,
								   "",
								   PGC_USERSET,
								   0,
								   NULL, NULL, NULL);
	prewarm_define_settings();
	MarkGUCPrefixReserved("madlib_mop");
	/*
	 * Preloaded: the slots and the queue are the server's, in shared memory, and a launcher
	 * keeps the sessions of madlib_mop.prewarm_roles ready (prewarm.c).
	 */
	if (process_shared_preload_libraries_in_progress)
	{
		server_slots_init();
		prewarm_register_launcher();
	}
}

PG_FUNCTION_INFO_V1(madlib_mop_max_worker_sessions);

/* The setting as this session sees it (calling this loads the library, which declares it). */
Datum
madlib_mop_max_worker_sessions(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT32(max_worker_sessions);
}
