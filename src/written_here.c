/*
 * written_in_transaction(regclass): did the current transaction (or one of its live
 * subtransactions) change this relation?
 *
 * Training, evaluation and prediction read their inputs in worker sessions of their own,
 * which see committed data only; a call refuses inputs its own open transaction wrote.
 * The answer must be exact.  pg_stat_xact_all_tables is not: on PostgreSQL 15 it also counts
 * the writes of this session's earlier, committed transactions until the session flushes
 * its statistics (a second or more later), so a psql script that fills a table and trains
 * at once would be refused.  Two facts are exact:
 *
 *  - the relation's pg_class row was written by this transaction (CREATE, TRUNCATE, ALTER:
 *    anything that gives it a new row version), tested with TransactionIdIsCurrentTransactionId,
 *    which knows this transaction's subtransactions;
 *  - the per-transaction part of the relation's pending statistics (the `trans` levels of
 *    PgStat_TableStatus) counts rows inserted, updated or deleted, or a truncation, by the
 *    levels of this transaction still open; a committed transaction's counts have been moved
 *    out of them, and an aborted subtransaction's writes are gone with it.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_class.h"
#include "fmgr.h"
#include "pgstat.h"
#include "utils/syscache.h"

PG_FUNCTION_INFO_V1(madlib_mop_written_in_transaction);

static bool
catalog_row_written_here(Oid relid)
{
	HeapTuple	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	bool		written;

	if (!HeapTupleIsValid(tuple))
		return false;
	written = TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetXmin(tuple->t_data));
	ReleaseSysCache(tuple);
	return written;
}

static bool
rows_written_here(Oid relid)
{
	PgStat_TableStatus *status = find_tabstat_entry(relid);
	PgStat_TableXactStatus *level;

	if (status == NULL)
		return false;
	for (level = status->trans; level != NULL; level = level->upper)
	{
		if (level->truncdropped || level->tuples_inserted > 0 ||
			level->tuples_updated > 0 || level->tuples_deleted > 0)
			return true;
	}
	return false;
}

Datum
madlib_mop_written_in_transaction(PG_FUNCTION_ARGS)
{
	Oid			relid = PG_GETARG_OID(0);

	if (!TransactionIdIsValid(GetTopTransactionIdIfAny()))
		PG_RETURN_BOOL(false);	/* this transaction has written nothing */
	PG_RETURN_BOOL(catalog_row_written_here(relid) || rows_written_here(relid));
}
