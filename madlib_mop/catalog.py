"""Looking up the user's tables and columns through SPI, with clear errors.

Names arrive as text (MADlib style: 'iris' or 'myschema.iris').  They are resolved by
PostgreSQL itself (`to_regclass`), and only the canonical, already-quoted `regclass` text
is ever put into SQL; column names go through `quote_ident`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from madlib_mop import errors
from madlib_mop.errors import MadlibMopError

_RESOLVE = "SELECT to_regclass($1)::oid AS oid, to_regclass($1)::text AS name"
_COLUMNS = """
    SELECT attname AS name, format_type(atttypid, atttypmod) AS type
    FROM pg_attribute
    WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped
    ORDER BY attnum
"""


@dataclass(frozen=True)
class Table:
    oid: int
    name: str  # regclass text: quoted and schema-qualified as needed, safe to put in SQL


def resolve_table(plpy: Any, name: str | None, *, argument: str = "source_table") -> Table:
    if name is None or not name.strip():
        raise MadlibMopError(
            f"{argument} must name a table",
            sqlstate=errors.INVALID_PARAMETER_VALUE,
            hint=f"Pass the table's name as {argument}, e.g. 'iris' or 'myschema.iris'.",
        )
    row = plpy.execute(plpy.prepare(_RESOLVE, ["text"]), [name])[0]
    if row["oid"] is None:
        raise MadlibMopError(
            f'{argument} "{name}" does not exist',
            sqlstate=errors.UNDEFINED_TABLE,
            hint="Give the name of an existing table, schema-qualified if its schema "
                 "is not on the search_path.",
        )
    return Table(oid=int(row["oid"]), name=row["name"])


def columns(plpy: Any, table: Table) -> dict[str, str]:
    """Column name -> SQL type, in table order."""
    rows = plpy.execute(plpy.prepare(_COLUMNS, ["oid"]), [table.oid])
    return {row["name"]: row["type"] for row in rows}


def column_type(plpy: Any, table: Table, column: str | None, *, argument: str) -> str:
    available = columns(plpy, table)
    if column not in available:
        raise MadlibMopError(
            f'{argument} "{column}" is not a column of {table.name}',
            sqlstate=errors.UNDEFINED_COLUMN,
            detail=f"{table.name} has columns: {', '.join(available)}.",
            hint=f"Pass one of these column names as {argument} (names are case-sensitive).",
        )
    return available[column]
