"""Object tables of custom functions (MADlib's `load_custom_function`), under PostgreSQL's
own trust rule: running code as the server's operating-system user is what a superuser or a
member of the predefined role `pg_execute_server_program` may already do (COPY ... PROGRAM).

So an object runs only if
  - its table is owned by such a role (no other role can then alter the table or its
    triggers),
  - the table has the extension's trigger, enabled always and alone, which writes into
    `written_by` the role that inserted or last updated the row (a column nobody can set
    by hand), and
  - the row's `written_by` is such a role, at the time the object is read.
A role that may write the table but not run code thus never gets its bytes unpickled.  The
checks read the catalog only; nothing here unpickles (`runtime.custom_functions` does, after
them).
"""

from __future__ import annotations

from typing import Any, Collection

from madlib_mop import errors
from madlib_mop.db import catalog
from madlib_mop.errors import MadlibMopError

# MADlib's columns, in its order, then who wrote the row.
COLUMNS = ("id", "name", "description", "object")
WRITER = "written_by"
TRIGGER = "madlib_mop_written_by"
TRUSTED_ROLE = "pg_execute_server_program"


def _trusted(role_oid: str) -> str:
    """SQL: the role (an oid expression) may run programs on the server, as COPY PROGRAM
    asks (superuser, or the privileges of pg_execute_server_program)."""
    return (f"EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.oid = {role_oid} AND "
            f"(r.rolsuper OR pg_catalog.pg_has_role(r.oid, '{TRUSTED_ROLE}', 'USAGE')))")


def _grant_hint(role: str) -> str:
    return (f"A superuser can run: GRANT {TRUSTED_ROLE} TO {role}; (it lets the role run "
            "programs as the server's operating-system user, which unpickling an object does).")


def require_trusted_caller(plpy: Any, action: str) -> None:
    """The calling role may run code on the server, else 42501 with the GRANT to ask for."""
    row = plpy.execute("SELECT pg_catalog.quote_ident(current_user) AS role, "
                       f"{_trusted('(SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user)')} AS ok")[0]
    if not row["ok"]:
        raise MadlibMopError(
            f"permission denied: role {row['role']} may not {action}: custom functions are "
            "Python code that runs inside the server",
            sqlstate=errors.INSUFFICIENT_PRIVILEGE, hint=_grant_hint(row["role"]))


def create(plpy: Any, table: catalog.NewTable) -> None:
    """A new object table: MADlib's columns, `written_by`, and the trigger that fills it.
    Readable by every role, as MADlib makes it (functions a trusted role loaded are for the
    analysts); only its owner writes it unless granted."""
    schema = catalog.extension_schema(plpy)
    plpy.execute(f"CREATE TABLE {table.quoted} (id serial, name text PRIMARY KEY, description text, "
                 f"object bytea NOT NULL, {WRITER} regrole NOT NULL)")
    plpy.execute(f"CREATE TRIGGER {TRIGGER} BEFORE INSERT OR UPDATE ON {table.quoted} "
                 f"FOR EACH ROW EXECUTE FUNCTION {schema}._custom_function_written_by()")
    plpy.execute(f"ALTER TABLE {table.quoted} ENABLE ALWAYS TRIGGER {TRIGGER}")
    plpy.execute(f"GRANT SELECT ON {table.quoted} TO PUBLIC")


def check_columns(plpy: Any, table: catalog.Table) -> None:
    """MADlib's phrase for a table without its columns (or without who wrote the rows)."""
    have = catalog.columns(plpy, table)
    missing = [c for c in (*COLUMNS, WRITER) if c not in have]
    if missing:
        raise MadlibMopError(
            f"Invalid custom function table {table.name}, missing columns: {missing}",
            sqlstate=errors.UNDEFINED_COLUMN,
            hint="Pass a table made by load_custom_function(), or a new name for one.")


def names(plpy: Any, object_table: str) -> tuple[catalog.Table, list[str]]:
    """The table (resolved as the caller names it) and the function names it holds."""
    table = catalog.resolve_table(plpy, object_table, argument="object_table")
    check_columns(plpy, table)
    return table, [r["name"] for r in plpy.execute(f"SELECT name FROM {table.name} ORDER BY id")]


def trusted_rows(plpy: Any, table: catalog.Table, wanted: Collection[str], *,
                 with_objects: bool) -> dict[str, dict]:
    """name -> {digest, object (with_objects)} of the wanted functions, once the table and
    each row pass the rule of this module; 42501 (or 22023 for a name not there) otherwise."""
    check_columns(plpy, table)
    schema = catalog.extension_schema(plpy)
    guard = plpy.execute(plpy.prepare(
        "SELECT pg_catalog.quote_ident(o.rolname) AS owner, "
        f"{_trusted('c.relowner')} AS owner_trusted, "
        "(SELECT count(*) FROM pg_catalog.pg_trigger t WHERE t.tgrelid = c.oid AND NOT t.tgisinternal "
        f"  AND t.tgname = '{TRIGGER}' AND t.tgenabled = 'A' AND t.tgtype = 23 "
        f"  AND t.tgfoid = '{schema}._custom_function_written_by()'::pg_catalog.regprocedure) AS ours, "
        "(SELECT count(*) FROM pg_catalog.pg_trigger t WHERE t.tgrelid = c.oid AND NOT t.tgisinternal) AS triggers, "
        "(SELECT count(*) FROM pg_catalog.pg_rewrite w WHERE w.ev_class = c.oid) AS rules "
        "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_roles o ON o.oid = c.relowner WHERE c.oid = $1",
        ["oid"]), [table.oid])[0]
    if not guard["owner_trusted"]:
        raise MadlibMopError(
            f"permission denied: the custom functions of {table.name} may not run: the table is "
            f"owned by role {guard['owner']}, which may not run code on the server",
            sqlstate=errors.INSUFFICIENT_PRIVILEGE,
            detail="An object runs only from a table owned by a superuser or a member of "
                   f"{TRUSTED_ROLE}, and only if such a role wrote its row.",
            hint=_grant_hint(guard["owner"]) + " Or have such a role load the functions into "
                 "a table of its own (load_custom_function).")
    if (guard["ours"], guard["triggers"], guard["rules"]) != (1, 1, 0):
        raise MadlibMopError(
            f"permission denied: the custom functions of {table.name} may not run: the table "
            f"lacks the trigger {TRIGGER} that records who writes its rows, or has other "
            "triggers or rules", sqlstate=errors.INSUFFICIENT_PRIVILEGE,
            hint="Load the functions with load_custom_function() into a table it makes.")
    rows = {r["name"]: r for r in plpy.execute(plpy.prepare(
        f"SELECT name, {WRITER}::text AS writer, {_trusted(WRITER + '::oid')} AS trusted, "
        "pg_catalog.encode(pg_catalog.sha256(object), 'hex') AS digest"
        + (", object" if with_objects else "") +
        f" FROM {table.name} WHERE name = ANY($1)", ["text[]"]), [sorted(wanted)])}
    for name in sorted(wanted):
        if name not in rows:
            raise MadlibMopError(
                f"custom function {name!r} is not in object_table {table.name}",
                sqlstate=errors.INVALID_PARAMETER_VALUE,
                hint=f"SELECT id, name, description FROM {table.name}; lists them; "
                     "load_custom_function() adds one.")
        if not rows[name]["trusted"]:
            raise MadlibMopError(
                f"permission denied: custom function {name!r} of {table.name} may not run: its "
                f"row was written by role {rows[name]['writer']}, which may not run code on the server",
                sqlstate=errors.INSUFFICIENT_PRIVILEGE,
                hint=_grant_hint(rows[name]["writer"]) + " Or have such a role load the "
                     "function again (delete_custom_function, then load_custom_function).")
    return {name: {"digest": r["digest"], "object": r.get("object")} for name, r in rows.items()}
