"""The database errors the layers above the store catch, named here so that catching them does
not mean importing the driver: the store is the only layer that talks to PostgreSQL."""

from __future__ import annotations

import psycopg
from psycopg import errors
from psycopg_pool import PoolTimeout

DatabaseError = psycopg.Error  # any error the database or the connection raised
OperationalError = psycopg.OperationalError  # the connection failed or was lost
ProgrammingError = psycopg.ProgrammingError  # e.g. a malformed connection string
InsufficientPrivilege = errors.InsufficientPrivilege
LockNotAvailable = errors.LockNotAvailable
QueryCanceled = errors.QueryCanceled  # statement_timeout
UndefinedTable = errors.UndefinedTable
InvalidSchemaName = errors.InvalidSchemaName

__all__ = ["DatabaseError", "InsufficientPrivilege", "InvalidSchemaName", "LockNotAvailable",
           "OperationalError", "PoolTimeout", "ProgrammingError", "QueryCanceled",
           "UndefinedTable"]
