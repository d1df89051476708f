"""The database errors the layers above the store catch, named here so that catching them does
not mean importing the driver: the store is the only layer that talks to PostgreSQL."""

from __future__ import annotations

import psycopg
from psycopg import errors
from psycopg_pool import PoolTimeout

from fairq.observe import DB_ERROR_KINDS

DatabaseError = psycopg.Error  # any error the database or the connection raised
OperationalError = psycopg.OperationalError  # the connection failed or was lost
ProgrammingError = psycopg.ProgrammingError  # e.g. a malformed connection string
InsufficientPrivilege = errors.InsufficientPrivilege
LockNotAvailable = errors.LockNotAvailable
QueryCanceled = errors.QueryCanceled  # statement_timeout
UndefinedTable = errors.UndefinedTable
InvalidSchemaName = errors.InvalidSchemaName

def error_kind(error: BaseException) -> str:
    """The kind of a database error (one of DB_ERROR_KINDS), from its SQLSTATE or its class."""
    if isinstance(error, PoolTimeout):
        return "pool_timeout"
    state = getattr(error, "sqlstate", None) or ""
    if state == "40P01":
        return "deadlock"
    if state == "40001":
        return "serialization_failure"
    if state.startswith("57P"):  # 57P01 admin shutdown, 57P02 crash shutdown, 57P03 starting up
        return "admin_shutdown"
    if state == "57014":
        return "statement_timeout"
    if state == "55P03":
        return "lock_timeout"
    if state.startswith("08") or (isinstance(error, OperationalError) and not state):
        return "connection_lost"  # the connection failed, broke, or was closed under us
    return "other"


__all__ = ["DB_ERROR_KINDS", "DatabaseError", "InsufficientPrivilege", "InvalidSchemaName",
           "LockNotAvailable", "OperationalError", "PoolTimeout", "ProgrammingError",
           "QueryCanceled", "UndefinedTable", "error_kind"]
