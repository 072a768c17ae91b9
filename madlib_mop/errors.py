"""Errors a user can act on, carrying PostgreSQL's SQLSTATE, DETAIL and HINT.

Runtime code raises `MadlibMopError`; `madlib_mop.plpy_bridge` turns it into a PostgreSQL
error with those fields, so a client sees e.g. SQLSTATE 42P01 and a HINT.
"""

from __future__ import annotations

# SQLSTATEs used by the project (PostgreSQL's own codes, Appendix A of its manual).
UNDEFINED_TABLE = "42P01"
INVALID_TRANSACTION_TERMINATION = "2D000"
UNDEFINED_COLUMN = "42703"
DATATYPE_MISMATCH = "42804"
NULL_VALUE_NOT_ALLOWED = "22004"
INVALID_PARAMETER_VALUE = "22023"
DATA_EXCEPTION = "22000"
DUPLICATE_TABLE = "42P07"
FEATURE_NOT_SUPPORTED = "0A000"
SYNTAX_ERROR = "42601"
UNDEFINED_OBJECT = "42704"
INSUFFICIENT_PRIVILEGE = "42501"
INVALID_AUTHORIZATION = "28000"
INVALID_SCHEMA_NAME = "3F000"
CONNECTION_FAILURE = "08006"
UNABLE_TO_CONNECT = "08001"
INSUFFICIENT_RESOURCES = "53000"
DISK_FULL = "53100"
IO_ERROR = "58030"
UNDEFINED_FILE = "58P01"
DUPLICATE_OBJECT = "42710"
DEPENDENT_OBJECTS_STILL_EXIST = "2BP01"
INVALID_TRANSACTION_STATE = "25000"
OBJECT_IN_USE = "55006"
OBJECT_NOT_IN_PREREQUISITE_STATE = "55000"
ADMIN_SHUTDOWN = "57P01"
CRASH_SHUTDOWN = "57P02"
CANNOT_CONNECT_NOW = "57P03"
ACTIVE_SQL_TRANSACTION = "25001"
UNDEFINED_FUNCTION = "42883"
EXTERNAL_ROUTINE_EXCEPTION = "38000"
NUMERIC_VALUE_OUT_OF_RANGE = "22003"
UNIQUE_VIOLATION = "23505"


class MadlibMopError(Exception):
    """An error in what the user asked for, with what to do about it."""

    def __init__(self, message: str, *, sqlstate: str = DATA_EXCEPTION,
                 detail: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate
        self.detail = detail
        self.hint = hint
