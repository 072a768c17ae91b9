/*
 * The worker pool's slots and queue in the server's shared memory, so that
 * madlib_mop.max_worker_sessions caps the worker sessions of every database of the server
 * and the queue is one queue (madlib_mop.engine.server_slots).
 *
 * They exist where the library is in shared_preload_libraries (shared memory is requested
 * when the server starts).  Elsewhere madlib_mop_pool_shared() is false and the pool falls
 * back on session-level advisory locks, which PostgreSQL keeps per database.
 *
 * A worker session takes a slot as its first statement and keeps it while it lives; a call
 * waiting for worker sessions holds a place in the queue (a ticket, in arrival order) over a
 * session of its own.  Both are given back by the backend's exit callback, whatever ends it;
 * a backend that crashes makes the postmaster reinitialize shared memory, which empties them.
 */
#include "postgres.h"

#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "server_slots.h"

typedef struct SlotEntry
{
	int			pid;			/* 0: free */
	Oid			database;
	Oid			role;			/* the session's login role */
} SlotEntry;

typedef struct QueueEntry
{
	int			pid;			/* 0: free */
	Oid			database;
	Oid			role;			/* the waiting call's role */
	int64		ticket;
	TimestampTz since;
} QueueEntry;

typedef struct PoolShared
{
	LWLock	   *lock;
	int64		next_ticket;
	SlotEntry	slots[MAX_WORKER_SESSIONS];
	QueueEntry	queue[MAX_WORKER_SESSIONS];
} PoolShared;

static PoolShared *pool = NULL;
static shmem_request_hook_type previous_request_hook = NULL;
static shmem_startup_hook_type previous_startup_hook = NULL;
static bool exit_callback_set = false;

static void
pool_request(void)
{
	if (previous_request_hook)
		previous_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(PoolShared)));
	RequestNamedLWLockTranche("madlib_mop", 1);
}

static void
pool_startup(void)
{
	bool		found;

	if (previous_startup_hook)
		previous_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	pool = ShmemInitStruct("madlib_mop worker pool", sizeof(PoolShared), &found);
	if (!found)
	{
		memset(pool, 0, sizeof(PoolShared));
		pool->lock = &(GetNamedLWLockTranche("madlib_mop"))->lock;
		pool->next_ticket = 1;
	}
	LWLockRelease(AddinShmemInitLock);
}

void
server_slots_init(void)
{
	previous_request_hook = shmem_request_hook;
	shmem_request_hook = pool_request;
	previous_startup_hook = shmem_startup_hook;
	shmem_startup_hook = pool_startup;
}

/* At the backend's exit: its slot and its places in the queue given back. */
static void
release_all(int code, Datum arg)
{
	if (pool == NULL)
		return;
	LWLockAcquire(pool->lock, LW_EXCLUSIVE);
	for (int i = 0; i < MAX_WORKER_SESSIONS; i++)
	{
		if (pool->slots[i].pid == MyProcPid)
			pool->slots[i].pid = 0;
		if (pool->queue[i].pid == MyProcPid)
			pool->queue[i].pid = 0;
	}
	LWLockRelease(pool->lock);
}

static void
require_pool(void)
{
	if (pool == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("madlib_mop's library is not in shared_preload_libraries"),
				 errhint("ALTER SYSTEM SET shared_preload_libraries = 'madlib_mop' (with the libraries "
						 "already there), then restart the server.")));
	if (!exit_callback_set)
	{
		before_shmem_exit(release_all, (Datum) 0);
		exit_callback_set = true;
	}
}

PG_FUNCTION_INFO_V1(madlib_mop_pool_shared);

/* Whether the slots and the queue are the server's (the library was preloaded). */
Datum
madlib_mop_pool_shared(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(pool != NULL);
}

PG_FUNCTION_INFO_V1(madlib_mop_take_server_slot);

/* A slot for this session if fewer than `cap` are taken in the whole server, else NULL. */
Datum
madlib_mop_take_server_slot(PG_FUNCTION_ARGS)
{
	int32		cap = PG_GETARG_INT32(0);
	int			taken = 0,
				free_slot = -1,
				own = -1;

	require_pool();
	if (cap > MAX_WORKER_SESSIONS)
		cap = MAX_WORKER_SESSIONS;
	LWLockAcquire(pool->lock, LW_EXCLUSIVE);
	for (int i = 0; i < MAX_WORKER_SESSIONS; i++)
	{
		if (pool->slots[i].pid == MyProcPid)
			own = i;
		else if (pool->slots[i].pid != 0)
			taken++;
		else if (free_slot < 0)
			free_slot = i;
	}
	if (own < 0 && taken < cap && free_slot >= 0)
	{
		pool->slots[free_slot].pid = MyProcPid;
		pool->slots[free_slot].database = MyDatabaseId;
		pool->slots[free_slot].role = GetSessionUserId();
		own = free_slot;
	}
	LWLockRelease(pool->lock);
	if (own < 0)
		PG_RETURN_NULL();
	PG_RETURN_INT32(own);
}

PG_FUNCTION_INFO_V1(madlib_mop_server_slots);

/* The slots taken: (pid, database, role) of each, every database of the server. */
Datum
madlib_mop_server_slots(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	SlotEntry  *seen = palloc(sizeof(SlotEntry) * MAX_WORKER_SESSIONS);
	int			count = 0;

	InitMaterializedSRF(fcinfo, 0);
	if (pool == NULL)
		return (Datum) 0;
	LWLockAcquire(pool->lock, LW_SHARED);
	for (int i = 0; i < MAX_WORKER_SESSIONS; i++)
		if (pool->slots[i].pid != 0)
			seen[count++] = pool->slots[i];
	LWLockRelease(pool->lock);
	for (int i = 0; i < count; i++)
	{
		Datum		values[3] = {Int32GetDatum(seen[i].pid), ObjectIdGetDatum(seen[i].database),
		ObjectIdGetDatum(seen[i].role)};
		bool		nulls[3] = {false, false, false};

		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

PG_FUNCTION_INFO_V1(madlib_mop_queue_enter);

/* A place in the server's queue for this session, as the current role: its ticket. */
Datum
madlib_mop_queue_enter(PG_FUNCTION_ARGS)
{
	int64		ticket = 0;

	require_pool();
	LWLockAcquire(pool->lock, LW_EXCLUSIVE);
	for (int i = 0; i < MAX_WORKER_SESSIONS; i++)
	{
		if (pool->queue[i].pid == 0)
		{
			ticket = pool->next_ticket++;
			pool->queue[i].pid = MyProcPid;
			pool->queue[i].database = MyDatabaseId;
			pool->queue[i].role = GetUserId();
			pool->queue[i].ticket = ticket;
			pool->queue[i].since = GetCurrentTimestamp();
			break;
		}
	}
	LWLockRelease(pool->lock);
	if (ticket == 0)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("madlib_mop: %d calls already wait for worker sessions", MAX_WORKER_SESSIONS)));
	PG_RETURN_INT64(ticket);
}

PG_FUNCTION_INFO_V1(madlib_mop_queue_leave);

/* This session's place `ticket` given back; false when it held no such place. */
Datum
madlib_mop_queue_leave(PG_FUNCTION_ARGS)
{
	int64		ticket = PG_GETARG_INT64(0);
	bool		left = false;

	require_pool();
	LWLockAcquire(pool->lock, LW_EXCLUSIVE);
	for (int i = 0; i < MAX_WORKER_SESSIONS; i++)
	{
		if (pool->queue[i].pid == MyProcPid && pool->queue[i].ticket == ticket)
		{
			pool->queue[i].pid = 0;
			left = true;
		}
	}
	LWLockRelease(pool->lock);
	PG_RETURN_BOOL(left);
}

PG_FUNCTION_INFO_V1(madlib_mop_server_queue);

/* The calls waiting: (ticket, pid, database, role, since), every database of the server. */
Datum
madlib_mop_server_queue(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	QueueEntry *seen = palloc(sizeof(QueueEntry) * MAX_WORKER_SESSIONS);
	int			count = 0;

	InitMaterializedSRF(fcinfo, 0);
	if (pool == NULL)
		return (Datum) 0;
	LWLockAcquire(pool->lock, LW_SHARED);
	for (int i = 0; i < MAX_WORKER_SESSIONS; i++)
		if (pool->queue[i].pid != 0)
			seen[count++] = pool->queue[i];
	LWLockRelease(pool->lock);
	for (int i = 0; i < count; i++)
	{
		Datum		values[5] = {Int64GetDatum(seen[i].ticket), Int32GetDatum(seen[i].pid),
			ObjectIdGetDatum(seen[i].database), ObjectIdGetDatum(seen[i].role),
		TimestampTzGetDatum(seen[i].since)};
		bool		nulls[5] = {false, false, false, false, false};

		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
