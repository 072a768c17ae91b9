/*
 * Worker sessions kept ready for named roles, so that a role's first job after a restart,
 * and every pg_cron firing, starts on sessions that have TensorFlow imported.
 *
 * A DBA names them in postgresql.conf (or ALTER SYSTEM; a reload applies a change):
 *
 *     madlib_mop.prewarm_roles = 'analyst@shop, etl@shop'   # role@database, ...
 *     madlib_mop.prewarm_sessions = 1                        # idle sessions per entry
 *
 * Where the library is preloaded, a launcher (a background worker without a database)
 * starts one background worker per database named there.  That worker, connected to its
 * database as the bootstrap superuser, calls the extension's _mop_prewarm() every few
 * seconds (madlib_mop.engine.prewarm): it opens the sessions a listed role lacks as that
 * role, over the server's socket and the same peer map as every worker session, on slots
 * of the server's pool, imports TensorFlow in them and leaves them idle for the role's
 * calls.  Nothing a role can set or pass chooses whom a session runs as: only the
 * superuser's settings name the roles.
 *
 * A database without the extension (or with a version that has no _mop_prewarm) is looked
 * at and left alone; a worker that fails (its database does not exist, say) is started
 * again a minute later, and says why in the server log each time.
 */
#include "postgres.h"

#include "access/xact.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/pg_list.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/backend_status.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/varlena.h"

#include "prewarm.h"

/* How often a database's worker looks for missing sessions, and how soon a failed one is
 * started again. */
#define LOOK_MS 5000
#define RETRY_MS 60000
/* Databases a launcher serves at once; more entries are left out, with a WARNING. */
#define MAX_PREWARM_DATABASES 64

PGDLLEXPORT void madlib_mop_prewarm_launcher_main(Datum arg);
PGDLLEXPORT void madlib_mop_prewarm_main(Datum arg);

static char *prewarm_roles = NULL;
static int	prewarm_sessions = 1;

typedef struct DatabaseWorker
{
	char		database[NAMEDATALEN];
	BackgroundWorkerHandle *handle;
	TimestampTz started;
	bool		wanted;			/* named by the setting at the last look */
} DatabaseWorker;

static DatabaseWorker workers[MAX_PREWARM_DATABASES];
static int	worker_count = 0;

/* The entries of madlib_mop.prewarm_roles; false if the list does not parse. */
static bool
split_entries(const char *value, List **entries, char **copy)
{
	*copy = pstrdup(value ? value : "");
	*entries = NIL;
	return SplitGUCList(*copy, ',', entries);
}

/* The database of an entry role@database (after its last '@'), NULL if none. */
static const char *
entry_database(const char *entry)
{
	const char *at = strrchr(entry, '@');

	if (at == NULL || at == entry || at[1] == '\0')
		return NULL;
	return at + 1;
}

static bool
check_prewarm_roles(char **newval, void **extra, GucSource source)
{
	List	   *entries;
	char	   *copy;
	ListCell   *cell;

	if (!split_entries(*newval, &entries, &copy))
	{
		GUC_check_errdetail("The list does not parse.");
		GUC_check_errhint("List entries as role@database, e.g. 'analyst@shop, etl@shop'.");
		return false;
	}
	foreach(cell, entries)
	{
		const char *entry = (const char *) lfirst(cell);

		if (entry_database(entry) == NULL)
		{
			GUC_check_errdetail("\"%s\" is not role@database.", entry);
			GUC_check_errhint("List entries as role@database, e.g. 'analyst@shop, etl@shop'.");
			return false;
		}
		if (strlen(entry_database(entry)) >= NAMEDATALEN)
		{
			GUC_check_errdetail("\"%s\" names a database longer than a name can be.", entry);
			return false;
		}
	}
	list_free(entries);
	pfree(copy);
	return true;
}

void
prewarm_define_settings(void)
{
	DefineCustomStringVariable("madlib_mop.prewarm_roles",
							   "Roles whose worker sessions are kept ready (TensorFlow imported), "
							   "as role@database, comma-separated; needs the library preloaded.",
							   NULL,
							   &prewarm_roles,
							   "",
							   PGC_SIGHUP,
							   0,
							   check_prewarm_roles, NULL, NULL);
	DefineCustomIntVariable("madlib_mop.prewarm_sessions",
							"Idle worker sessions kept ready for each entry of madlib_mop.prewarm_roles.",
							NULL,
							&prewarm_sessions,
							1, 0, 1000,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);
}

void
prewarm_register_launcher(void)
{
	BackgroundWorker worker;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 10;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "madlib_mop");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "madlib_mop_prewarm_launcher_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "madlib_mop prewarm launcher");
	snprintf(worker.bgw_type, BGW_MAXLEN, "madlib_mop prewarm launcher");
	RegisterBackgroundWorker(&worker);
}

/* Is `database` named by an entry of the setting as it is now? */
static bool
database_named(const char *database)
{
	List	   *entries;
	char	   *copy;
	ListCell   *cell;
	bool		named = false;

	if (split_entries(prewarm_roles, &entries, &copy))
		foreach(cell, entries)
		{
			const char *found = entry_database((const char *) lfirst(cell));

			if (found != NULL && strcmp(found, database) == 0 && prewarm_sessions > 0)
				named = true;
		}
	list_free(entries);
	pfree(copy);
	return named;
}

static void
start_database_worker(DatabaseWorker *entry)
{
	BackgroundWorker worker;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;	/* the launcher starts it again */
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "madlib_mop");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "madlib_mop_prewarm_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "madlib_mop prewarm %s", entry->database);
	snprintf(worker.bgw_type, BGW_MAXLEN, "madlib_mop prewarm");
	strlcpy(worker.bgw_extra, entry->database, BGW_EXTRALEN);
	worker.bgw_notify_pid = MyProcPid;
	entry->started = GetCurrentTimestamp();
	if (!RegisterDynamicBackgroundWorker(&worker, &entry->handle))
	{
		entry->handle = NULL;
		ereport(WARNING,
				(errmsg("madlib_mop: no background worker slot for the prewarm of database \"%s\"",
						entry->database),
				 errhint("Raise max_worker_processes (a restart).")));
	}
}

/* Start a worker for every database named, and stop those of databases no longer named. */
static void
sync_database_workers(void)
{
	List	   *entries;
	char	   *copy;
	ListCell   *cell;

	for (int i = 0; i < worker_count; i++)
		workers[i].wanted = false;
	if (split_entries(prewarm_roles, &entries, &copy) && prewarm_sessions > 0)
		foreach(cell, entries)
		{
			const char *database = entry_database((const char *) lfirst(cell));
			int			i;

			if (database == NULL)
				continue;
			for (i = 0; i < worker_count; i++)
				if (strcmp(workers[i].database, database) == 0)
					break;
			if (i == worker_count)
			{
				if (worker_count == MAX_PREWARM_DATABASES)
				{
					ereport(WARNING,
							(errmsg("madlib_mop: madlib_mop.prewarm_roles names more than %d databases; \"%s\" is left out",
									MAX_PREWARM_DATABASES, database)));
					continue;
				}
				memset(&workers[i], 0, sizeof(DatabaseWorker));
				strlcpy(workers[i].database, database, NAMEDATALEN);
				worker_count++;
			}
			workers[i].wanted = true;
		}
	list_free(entries);
	pfree(copy);

	for (int i = 0; i < worker_count; i++)
	{
		DatabaseWorker *entry = &workers[i];
		pid_t		pid;
		bool		stopped = entry->handle == NULL ||
			GetBackgroundWorkerPid(entry->handle, &pid) == BGWH_STOPPED;

		if (!entry->wanted)
		{
			if (!stopped)
				TerminateBackgroundWorker(entry->handle);
			workers[i--] = workers[--worker_count];
			continue;
		}
		if (stopped && (entry->started == 0 ||
						TimestampDifferenceExceeds(entry->started, GetCurrentTimestamp(), RETRY_MS)))
			start_database_worker(entry);
	}
}

void
madlib_mop_prewarm_launcher_main(Datum arg)
{
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	for (;;)
	{
		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
		sync_database_workers();
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 LOOK_MS, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

/* One look in this database: the extension's _mop_prewarm(), where it has one. */
static void
prewarm_once(void)
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "madlib_mop prewarm");
	if (SPI_execute("SELECT pg_catalog.quote_ident(n.nspname) FROM pg_catalog.pg_extension e "
					"JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace "
					"WHERE e.extname = 'madlib_mop' AND pg_catalog.to_regprocedure("
					"pg_catalog.quote_ident(n.nspname) || '._mop_prewarm()') IS NOT NULL",
					true, 1) == SPI_OK_SELECT && SPI_processed == 1)
	{
		char	   *schema = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);

		SPI_execute(psprintf("SELECT %s._mop_prewarm()", schema), false, 0);
	}
	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_stat(true);
	pgstat_report_activity(STATE_IDLE, NULL);
}

void
madlib_mop_prewarm_main(Datum arg)
{
	char		database[NAMEDATALEN];

	strlcpy(database, MyBgworkerEntry->bgw_extra, sizeof(database));
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(database, NULL, 0);
	pgstat_report_appname("madlib_mop prewarm");

	for (;;)
	{
		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
		if (!database_named(database))
			proc_exit(0);
		prewarm_once();
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 LOOK_MS, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}
