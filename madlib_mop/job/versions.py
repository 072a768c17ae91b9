"""if_output_exists => 'new_version': which output table a scheduled call trains into."""

from __future__ import annotations

from typing import Any

from madlib_mop.db import catalog
from madlib_mop.job import repository
from madlib_mop.job.record import JobArguments
from madlib_mop.job.tables import SUFFIXES_LONGEST_FIRST, TABLE_SUFFIXES


VERSION_ROOM = "_v99"  # the suffix a versioned name must leave room for


def versioned_output(plpy: Any, out: catalog.NewTable, arguments: dict) -> catalog.NewTable:
    """if_output_exists => 'new_version': the call's output becomes its family's unfinished
    job's (continued) when that job was started with the same arguments, else the name
    itself if free, else the first free `<name>_v<N>`.  The family is recorded in the
    job's arguments, so the next run finds it.  An unfinished job on the name itself that
    was started without the policy is continued as it was started.  `arguments` (the
    call's, as the job will record them) get the policy and the family."""
    for suffix in SUFFIXES_LONGEST_FIRST:
        out.sibling(VERSION_ROOM + suffix, plpy)  # the versions' names will fit
    own = repository.find_job(plpy, out.quoted, unfinished=True)
    if own is not None and own.arguments.output_family is None:
        return out
    family = out.quoted
    arguments["if_output_exists"] = "new_version"
    arguments["output_family"] = family
    for job in repository.unfinished_of_family(plpy, family):
        if not repository.tables_exist(plpy, job):
            continue
        recorded = job.arguments
        if same_call(recorded, JobArguments.of(arguments)):
            arguments["model_output_table"] = recorded.model_output_table
            return catalog.new_table(plpy, recorded.model_output_table,
                                     argument="model_output_table")
        plpy.notice(f"job {job.job_id} ({recorded.model_output_table}) is unfinished but "
                    "was started with other arguments: it is left as it is")
    version = 1
    candidate = out
    while taken(plpy, candidate):
        version += 1
        name = f"{out.name}_v{version}"
        quoted = f"{plpy.quote_ident(out.schema)}.{plpy.quote_ident(name)}"
        candidate = catalog.new_table(plpy, quoted, argument="model_output_table")
        for suffix in SUFFIXES_LONGEST_FIRST:
            if suffix:
                candidate.sibling(suffix, plpy)  # checks the names fit (past _v99)
    if version > 1:
        plpy.notice(f"model_output_table {family} exists: training into {candidate.quoted} "
                    "(if_output_exists => 'new_version')")
    arguments["model_output_table"] = candidate.quoted
    return candidate


def same_call(recorded: JobArguments, arguments: JobArguments) -> bool:
    """The same call but for the version it wrote."""
    return recorded.replace(model_output_table="").same_call(arguments.replace(model_output_table=""))


def taken(plpy: Any, out: catalog.NewTable) -> bool:
    """Whether the output or any of its sibling tables exists, or a job records it."""
    return any(out.sibling(suffix, plpy).exists(plpy) if suffix else out.exists(plpy)
               for suffix in TABLE_SUFFIXES.values()) or repository.output_recorded(plpy, out.quoted)
