"""MADlib's custom function catalog: load_custom_function, delete_custom_function and
load_top_k_accuracy_function.

An object table holds dill-serialised callables (losses and metrics) by name, as in MADlib.
Only a role that may already run code as the server's operating-system user (a superuser or
a member of pg_execute_server_program) may load one; analysts then name the functions in
compile_params and pass the table as object_table (`db.custom_functions` says when a
worker runs an object).  Loading checks that the bytes are a pickle without running them.
"""

from __future__ import annotations

from typing import Any

from madlib_mop import errors
from madlib_mop.db import catalog, custom_functions
from madlib_mop.errors import MadlibMopError
from madlib_mop.runtime.custom_functions import check_pickle, top_k_object

MODULE = "Keras Custom Function"  # MADlib's name for these functions in its messages


def load_custom_function(plpy: Any, object_table: str, object: bytes | None, name: str | None,
                         description: str | None = None) -> None:
    if name is None or not name.strip():
        raise MadlibMopError("name is NULL: function name cannot be NULL",
                             sqlstate=errors.NULL_VALUE_NOT_ALLOWED,
                             hint="Name the function as compile_params will name it, e.g. 'my_loss'.")
    if not name.isidentifier():
        raise MadlibMopError(f"function name {name!r} is not a Python identifier",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="compile_params names a function like a variable: letters, "
                                  "digits and _, e.g. 'focal_loss'.")
    check_pickle(object, name)
    custom_functions.require_trusted_caller(plpy, "load a custom function")
    table = _object_table(plpy, object_table)
    taken = plpy.execute(plpy.prepare(f"SELECT id FROM {table} WHERE name = $1", ["text"]), [name])
    if taken:
        raise MadlibMopError(f"Function '{name}' already exists in {table}",
                             sqlstate=errors.DUPLICATE_OBJECT,
                             hint=f"Delete it first (delete_custom_function({plpy.quote_literal(table)}, "
                                  f"{plpy.quote_literal(name)})) or load it under another name.")
    plpy.execute(plpy.prepare(f"INSERT INTO {table} (name, description, object) VALUES ($1, $2, $3)",
                              ["text", "text", "bytea"]), [name, description, object])
    plpy.notice(f"{MODULE}: Added function {name} to {table} table")


def _object_table(plpy: Any, object_table: str | None) -> str:
    """The object table to load into: an existing one made by this function, or a new one."""
    new = catalog.new_table(plpy, object_table, argument="object_table")
    if new.schema == "pg_temp":
        raise MadlibMopError("object_table may not be temporary",
                             sqlstate=errors.FEATURE_NOT_SUPPORTED,
                             hint="Worker sessions cannot read another session's temporary "
                                  "tables: name a table of an ordinary schema.")
    if new.exists(plpy):
        table = catalog.resolve_table(plpy, new.quoted, argument="object_table")
        custom_functions.trusted_rows(plpy, table, (), with_objects=False)  # its owner, trigger
        return table.name
    new.must_not_exist(plpy)  # (checks the right to create in its schema)
    custom_functions.create(plpy, new)
    plpy.notice(f"{MODULE}: Created new custom function table {new.quoted}.")
    return new.quoted


def delete_custom_function(plpy: Any, object_table: str, id: int | None) -> None:
    _delete(plpy, object_table, id, None)


def delete_custom_function_by_name(plpy: Any, object_table: str, name: str | None) -> None:
    _delete(plpy, object_table, None, name)


def _delete(plpy: Any, object_table: str, id: int | None, name: str | None) -> None:
    table = catalog.resolve_table(plpy, object_table, argument="object_table")
    custom_functions.check_columns(plpy, table)
    if id is None and name is None:
        raise MadlibMopError("function id/name cannot be NULL", sqlstate=errors.NULL_VALUE_NOT_ALLOWED,
                             hint=f"SELECT id, name FROM {table.name}; lists them.")
    which, value, kind = ("id", id, "integer") if id is not None else ("name", name, "text")
    deleted = plpy.execute(plpy.prepare(f"DELETE FROM {table.name} WHERE {which} = $1 RETURNING id, name",
                                        [kind]), [value])
    if not deleted:
        raise MadlibMopError(f"Object {which} {value} not found in {table.name}",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint=f"SELECT id, name FROM {table.name}; lists them.")
    plpy.notice(f"{MODULE}: Object id {deleted[0]['id']} ({deleted[0]['name']}) has been deleted "
                f"from {table.name}.")
    left = plpy.execute(plpy.prepare(
        f"SELECT (SELECT count(*) FROM {table.name}) AS n, "
        "pg_catalog.pg_has_role(c.relowner, 'USAGE') AS owned "
        "FROM pg_catalog.pg_class c WHERE c.oid = $1", ["oid"]), [table.oid])[0]
    if left["n"] == 0 and left["owned"]:  # MADlib drops the table with its last function
        plpy.execute(f"DROP TABLE {table.name}")
        plpy.notice(f"{MODULE}: Dropping empty custom keras function table {table.name}")


def load_top_k_accuracy_function(plpy: Any, object_table: str, k: int | None) -> None:
    if k is None or k < 1:
        raise MadlibMopError(f"k is {k}: For top k accuracy functions k has to be a positive integer",
                             sqlstate=errors.INVALID_PARAMETER_VALUE, hint="Pass k >= 1, e.g. 3.")
    name = f"top_{k}_accuracy"
    load_custom_function(plpy, object_table, top_k_object(k), name, f"returns {name}")
