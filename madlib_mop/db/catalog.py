"""Looking up the user's tables and columns through SPI, with clear errors.

Names arrive as text (MADlib style: 'iris' or 'myschema.iris').  They are resolved by
PostgreSQL itself (`to_regclass`) against the caller's search_path (the runtime itself runs
with a pinned one, see `plpy_bridge`), and only the canonical, already-quoted `regclass`
text is ever put into SQL; column names go through `quote_ident`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from madlib_mop import errors
from madlib_mop import plpy_bridge
from madlib_mop.errors import MadlibMopError

# Names are always schema-qualified: they are also used by other sessions (workers),
# whose search_path may differ.
_DESCRIBE = """
    SELECT c.oid, quote_ident(n.nspname) || '.' || quote_ident(c.relname) AS name, c.relkind AS kind,
           has_table_privilege(c.oid, 'SELECT') AS readable, current_user AS role
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = $1
"""
_COLUMNS = """
    SELECT a.attname AS name, format_type(a.atttypid, a.atttypmod) AS type,
           format_type(a.atttypid, NULL) AS base_type, t.typcategory AS category,
           e.typcategory AS element_category
    FROM pg_attribute a
    JOIN pg_type t ON t.oid = a.atttypid
    LEFT JOIN pg_type e ON e.oid = t.typelem AND t.typcategory = 'A'
    WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped
    ORDER BY a.attnum
"""


@dataclass(frozen=True)
class Table:
    oid: int
    name: str  # "schema"."table", quoted as needed: safe to put in SQL
    kind: str = "r"  # pg_class.relkind


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # with modifiers, e.g. character varying(10)
    base_type: str  # without, e.g. character varying; real[]
    category: str  # pg_type.typcategory: N numeric, S string, B boolean, A array, ...
    element_category: str | None  # for arrays, the category of the elements

    @property
    def is_numeric(self) -> bool:
        return self.category == "N"

    @property
    def is_numeric_array(self) -> bool:
        return self.category == "A" and self.element_category == "N"


def resolve_table(plpy: Any, name: str | int | None, *, argument: str = "source_table") -> Table:
    """A table the caller may read, by the name the caller gave (resolved with the caller's
    search_path) or by oid (a worker given a table its caller resolved)."""
    if isinstance(name, int):
        return _described(plpy, name, str(name), argument)
    if name is None or not name.strip():
        raise MadlibMopError(
            f"{argument} must name a table: NULL/empty input table name",
            sqlstate=errors.INVALID_PARAMETER_VALUE,
            hint=f"Pass the table's name as {argument}, e.g. 'iris' or 'myschema.iris'.",
        )
    return _described(plpy, resolve_name(plpy, name), name, argument)


def _described(plpy: Any, oid: int | None, name: str, argument: str) -> Table:
    rows = plpy.execute(plpy.prepare(_DESCRIBE, ["oid"]), [oid]) if oid is not None else []
    if not rows:
        raise MadlibMopError(
            # MADlib's phrase: scripts look for it
            f"{argument}: Input table '{name}' does not exist",
            sqlstate=errors.UNDEFINED_TABLE,
            hint="Give the name of an existing table, schema-qualified if its schema "
                 "is not on the search_path.",
        )
    row = rows[0]
    if not row["readable"]:
        raise MadlibMopError(
            f"permission denied: {argument} {row['name']} is not readable by role "
            f"{row['role']}", sqlstate=errors.INSUFFICIENT_PRIVILEGE,
            hint=f"The table's owner or a DBA can run: GRANT SELECT ON {row['name']} TO "
                 f"{plpy.quote_ident(row['role'])};")
    return Table(oid=int(row["oid"]), name=row["name"], kind=row["kind"])


def sibling_table(plpy: Any, table: Table, suffix: str) -> Table:
    """The table MADlib names `<table><suffix>` in the same schema (e.g. `_info`), which must
    exist."""
    row = plpy.execute(plpy.prepare(
        "SELECT pg_catalog.format('%I.%I', n.nspname, c.relname || $2) AS name "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1",
        ["oid", "text"]), [table.oid, suffix])[0]
    return resolve_table(plpy, row["name"], argument="table")


_SUMMARY_NAME = (
    "SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname || '_summary') AS s, "
    "to_regclass(format('%I.%I', n.nspname, c.relname || '_summary'))::oid AS oid "
    "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1")


def summary_of(plpy: Any, table: Table) -> tuple[str, list[dict]] | None:
    """MADlib's `<table>_summary` beside `table`: (its quoted name, its rows), or None if
    there is no such table.  One the caller may not read is refused with the GRANT to ask for."""
    found = plpy.execute(plpy.prepare(_SUMMARY_NAME, ["oid"]), [table.oid])[0]
    if found["oid"] is None:
        return None
    name = _described(plpy, int(found["oid"]), found["s"], "table").name
    return name, [dict(r) for r in plpy.execute(f"SELECT * FROM {name}")]


def resolve_name(plpy: Any, name: str) -> int | None:
    """The oid of the relation `name` names for the caller (its search_path), or None.
    Nothing but the qualified built-in runs under the caller's path."""
    statement = ("SELECT pg_catalog.to_regclass(" + plpy.quote_literal(name)
                 + "::pg_catalog.text)::pg_catalog.oid AS r")
    try:
        with plpy_bridge.caller_search_path(plpy):
            row = plpy.execute(statement)[0]
    except plpy.SPIError:  # a name that is not a name, e.g. 'a.b.c.d'
        return None
    return None if row["r"] is None else int(row["r"])


def is_temporary(plpy: Any, oid: int) -> bool:
    return plpy.execute(plpy.prepare("SELECT relpersistence = 't' AS t FROM pg_catalog.pg_class "
                                     "WHERE oid = $1", ["oid"]), [oid])[0]["t"]


def name_parts(plpy: Any, oid: int) -> list[str]:
    """[schema, table] of a relation (how a task names a table; the receiver quotes it)."""
    row = plpy.execute(plpy.prepare(
        "SELECT n.nspname AS s, c.relname AS t FROM pg_catalog.pg_class c "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1", ["oid"]), [oid])[0]
    return [row["s"], row["t"]]


def columns(plpy: Any, table: Table) -> dict[str, Column]:
    """Column name -> Column, in table order."""
    rows = plpy.execute(plpy.prepare(_COLUMNS, ["oid"]), [table.oid])
    return {row["name"]: Column(row["name"], row["type"], row["base_type"], row["category"],
                                row["element_category"]) for row in rows}


def column(plpy: Any, table: Table, name: str | None, *, argument: str) -> Column:
    available = columns(plpy, table)
    if name not in available:
        raise MadlibMopError(
            f'{argument} "{name}" is not a column of {table.name}: '
            f"Column '{name}' does not exist in table '{table.name}'",
            sqlstate=errors.UNDEFINED_COLUMN,
            detail=f"{table.name} has columns: {', '.join(available)}.",
            hint=f"Pass one of these column names as {argument} (names are case-sensitive).",
        )
    return available[name]


def column_type(plpy: Any, table: Table, name: str | None, *, argument: str) -> str:
    return column(plpy, table, name, argument=argument).type


def split_identifiers(text: str) -> list[str]:
    """Split 'a, "B c", d' on the commas outside double quotes (a SQL column list)."""
    pieces, current, quoted = [], [], False
    for char in text:
        if char == '"':
            quoted = not quoted
        if char == "," and not quoted:
            pieces.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    pieces.append("".join(current).strip())
    return pieces


def column_names(plpy: Any, text: str | None, *, argument: str) -> list[str]:
    """Column names as SQL reads them: unquoted names fold to lower case."""
    if text is None or not text.strip():
        raise MadlibMopError(f"{argument} must name a column",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint=f"Pass a column name (or a comma-separated list) as {argument}.")
    names = []
    for piece in split_identifiers(text):
        try:
            parts = plpy.execute(plpy.prepare("SELECT parse_ident($1) AS p", ["text"]), [piece])[0]["p"]
        except plpy.SPIError:
            parts = None
        if not parts or len(parts) != 1:
            raise MadlibMopError(f'{argument} "{piece}" is not a column name',
                                 sqlstate=errors.INVALID_PARAMETER_VALUE,
                                 hint="Give column names, separated by commas; quote names "
                                      "with capitals or spaces.")
        names.append(parts[0])
    return names


@dataclass(frozen=True)
class NewTable:
    """A table the function is about to create, named by the user."""

    schema: str
    name: str
    quoted: str  # "schema"."name", safe to put in SQL
    argument: str

    def sibling(self, suffix: str, plpy: Any) -> "NewTable":
        """The table MADlib names `<output>_summary`, `<output>_info`, ... beside this one."""
        name = self.name + suffix
        if len(name.encode()) > 63:
            raise MadlibMopError(
                f'{self.argument} "{self.name}" is too long to add "{suffix}"',
                sqlstate=errors.INVALID_PARAMETER_VALUE,
                hint=f"Use a name of at most {63 - len(suffix.encode())} bytes.",
            )
        return NewTable(self.schema, name,
                        f"{plpy.quote_ident(self.schema)}.{plpy.quote_ident(name)}", self.argument)

    def exists(self, plpy: Any) -> bool:
        row = plpy.execute(plpy.prepare("SELECT to_regclass($1) IS NOT NULL AS e", ["text"]),
                           [self.quoted])[0]
        return bool(row["e"])

    def must_not_exist(self, plpy: Any) -> None:
        if self.exists(plpy):
            raise MadlibMopError(
                f"{self.argument}: Output table '{self.quoted}' already exists",  # (MADlib's phrase)
                sqlstate=errors.DUPLICATE_TABLE,
                hint="Drop it first, or pass another name.",
            )
        if self.schema == "pg_temp":  # temporary tables: every session may make its own
            return
        row = plpy.execute(plpy.prepare(
            "SELECT has_schema_privilege(n.oid, 'CREATE') AS can, current_user AS role "
            "FROM pg_namespace n WHERE n.nspname = $1", ["text"]), [self.schema])[0]
        if not row["can"]:
            raise MadlibMopError(
                f"permission denied: role {row['role']} may not create {self.argument} "
                f"{self.quoted}", sqlstate=errors.INSUFFICIENT_PRIVILEGE,
                hint=f"Name a table in a schema you may create in, or ask for GRANT CREATE ON "
                     f"SCHEMA {plpy.quote_ident(self.schema)} TO {plpy.quote_ident(row['role'])};")


def new_table(plpy: Any, name: str | None, *, argument: str) -> NewTable:
    """Parse a user-given table name ('t' or 'schema.t') for a table to create."""
    if name is None or not name.strip():
        # MADlib's phrase for the same mistake ends the message: scripts look for it.
        raise MadlibMopError(f"{argument} must name a table: NULL/empty output table name",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint=f"Pass the new table's name as {argument}.")
    try:
        parts = plpy.execute(plpy.prepare(
            "SELECT parse_ident($1) AS parts, current_schema() AS current", ["text"]), [name])[0]
    except plpy.SPIError:
        parts = None
    calling = plpy_bridge.caller()
    if parts is not None and calling is not None:  # where the caller's CREATE TABLE would go
        parts = {"parts": parts["parts"], "current": calling.current_schema}
    if parts is None or len(parts["parts"]) > 2:
        raise MadlibMopError(f'{argument} "{name}" is not a valid table name',
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Use name or schema.name; quote names with capitals or spaces.")
    idents = parts["parts"]
    schema = idents[0] if len(idents) == 2 else parts["current"]
    if schema is None:
        raise MadlibMopError("no schema to create the table in",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint=f"Qualify {argument} with a schema, or set search_path.")
    table = idents[-1]
    if schema != "pg_temp" and not plpy.execute(plpy.prepare(  # pg_temp: the session's own
            "SELECT count(*) AS n FROM pg_namespace WHERE nspname = $1", ["text"]), [schema])[0]["n"]:
        raise MadlibMopError(f'{argument} "{name}": schema "{schema}" does not exist',
                             sqlstate=errors.INVALID_SCHEMA_NAME,
                             hint="Create the schema first, or name the table in an existing one.")
    if len(table.encode()) > 63:
        raise MadlibMopError(f'{argument} "{name}" is longer than 63 bytes',
                             sqlstate=errors.INVALID_PARAMETER_VALUE, hint="Use a shorter name.")
    return NewTable(schema, table, f"{plpy.quote_ident(schema)}.{plpy.quote_ident(table)}", argument)


def qualified_name(plpy: Any, parts: list[str]) -> str:
    """A [schema, table] pair (as tasks and job rows name tables) quoted for SQL."""
    return ".".join(plpy.quote_ident(part) for part in parts)


def extension_schema(plpy: Any) -> str:
    """The quoted schema madlib_mop is installed in, for calls to its own objects."""
    return plpy.quote_ident(extension_schema_name(plpy))


def extension_schema_name(plpy: Any) -> str:
    """The name of the schema madlib_mop is installed in (for psycopg.sql.Identifier)."""
    row = plpy.execute("SELECT n.nspname AS s FROM pg_extension e "
                       "JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'madlib_mop'")
    if not row:
        raise MadlibMopError("the madlib_mop extension is not installed in this database",
                             sqlstate=errors.UNDEFINED_OBJECT,
                             hint="CREATE EXTENSION madlib_mop SCHEMA madlib_mop CASCADE;")
    return row[0]["s"]


def committed(plpy: Any, tables: dict[str, Table], packed: tuple[str, ...] = ()) -> None:
    """Refuse inputs this transaction wrote and has not committed: worker sessions, which read
    them, see committed data only (the table would be missing, or empty, for them).  The
    summaries of the `packed` arguments' tables are inputs too.  Temporary tables are refused
    for the same reason: no other session sees them."""
    temporary = plpy.execute(plpy.prepare(
        "SELECT t.argument FROM unnest($1::oid[], $2::text[]) AS t(relid, argument) "
        "JOIN pg_class c ON c.oid = t.relid WHERE c.relpersistence = 't' LIMIT 1",
        ["oid[]", "text[]"]), [[table.oid for table in tables.values()], list(tables)])
    if temporary:
        argument = temporary[0]["argument"]
        raise MadlibMopError(
            f"{argument} {tables[argument].name} is a temporary table, which worker sessions "
            "cannot read", sqlstate=errors.FEATURE_NOT_SUPPORTED,
            detail="Training, evaluation and prediction read their inputs in worker sessions of "
                   "their own; a temporary table is seen by the session that made it alone.",
            hint=f"Make it an ordinary table: CREATE TABLE ... AS SELECT * FROM {tables[argument].name}. "
                 "Outputs may be temporary (pg_temp.name).")
    if plpy.execute("SELECT pg_catalog.pg_current_xact_id_if_assigned() IS NULL AS none")[0]["none"]:
        return  # this transaction has written nothing
    # written_in_transaction (C) is exact: pg_stat_xact_all_tables would also count this
    # session's earlier, committed transactions until its statistics are flushed.
    written = f"{extension_schema(plpy)}.written_in_transaction"
    found = plpy.execute(plpy.prepare(
        "SELECT t.argument FROM unnest($1::oid[], $2::text[]) AS t(relid, argument) "
        f"JOIN pg_class c ON c.oid = t.relid WHERE {written}(c.oid) OR (t.argument = ANY($3) "
        f"AND {written}(to_regclass(format('%s.%I', c.relnamespace::regnamespace, "
        "c.relname || '_summary')))) LIMIT 1", ["oid[]", "text[]", "text[]"]),
        [[table.oid for table in tables.values()], list(tables), list(packed)])
    if found:
        argument = found[0]["argument"]
        raise MadlibMopError(
            f"{argument} {tables[argument].name} was written by this transaction, which has not "
            "committed yet",
            sqlstate=errors.INVALID_TRANSACTION_STATE,
            detail="Training, evaluation and prediction read their inputs in worker sessions of "
                   "their own, which see committed data only.",
            hint="COMMIT the statements that made it first: a script inside BEGIN ... COMMIT, "
                 "or run by psql -1 (--single-transaction), is one transaction; run it without.")

