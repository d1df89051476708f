"""Writing in the caller's transaction: the psycopg connection behind what a caller passes as
``connection=`` (a psycopg connection, or a SQLAlchemy connection or session on the psycopg
driver), so that a job commits or rolls back with the caller's own work."""

from __future__ import annotations

import inspect
from typing import Any

import psycopg

from fairq.errors import InvalidInput


def connection_for(obj: Any) -> psycopg.Connection[Any]:
    """The psycopg connection behind a psycopg, SQLAlchemy Connection or SQLAlchemy Session.

    Writing through it makes the job commit or roll back with the caller's transaction.
    """
    if isinstance(obj, psycopg.Connection):
        return obj
    if isinstance(obj, psycopg.AsyncConnection) or any(
            inspect.iscoroutinefunction(getattr(type(obj), m, None))
            for m in ("connection", "get_raw_connection")):
        raise InvalidInput(f"connection= is async ({type(obj).__name__}): await the async "
                           "methods instead (enqueue_async, enqueue_many_async)")
    get_conn = getattr(obj, "connection", None)
    if callable(get_conn):  # SQLAlchemy Session: .connection() -> Connection (in its transaction)
        obj = get_conn()
    in_tx = getattr(obj, "in_transaction", None)
    if callable(in_tx) and not in_tx():
        # A SQLAlchemy Connection only commits what it knows it began: begin now so the
        # caller's conn.commit() / conn.rollback() covers the job we write underneath.
        obj.begin()
    raw = getattr(obj, "connection", None)  # SQLAlchemy Connection -> PoolProxiedConnection
    dbapi = getattr(raw, "dbapi_connection", None)
    if isinstance(dbapi, psycopg.Connection):
        return dbapi
    driver = type(dbapi).__module__.split(".")[0] if dbapi is not None else None
    if driver is not None and driver != "psycopg":
        # A plain postgresql:// URL gives SQLAlchemy's default driver, psycopg2.
        raise InvalidInput(
            f"connection= needs SQLAlchemy's psycopg (3) driver, not {driver}: create the engine "
            "with a postgresql+psycopg:// URL (fairq.config.sqlalchemy_url(dsn) makes one)"
        )
    raise InvalidInput(
        "connection= takes a psycopg Connection, a SQLAlchemy Connection or a SQLAlchemy "
        f"Session using the psycopg driver, not {type(obj).__name__}"
    )


async def async_connection_for(obj: Any) -> psycopg.AsyncConnection[Any]:
    """The psycopg ``AsyncConnection`` behind a psycopg, SQLAlchemy ``AsyncConnection`` or
    ``AsyncSession``: writing through it joins the caller's transaction."""
    if isinstance(obj, psycopg.AsyncConnection):
        return obj
    if isinstance(obj, psycopg.Connection):
        raise InvalidInput("the async API takes a psycopg AsyncConnection; for a Connection "
                           "use the plain methods (enqueue, enqueue_many)")
    # Looked up on the type: AsyncConnection.connection is a property that raises.
    if inspect.iscoroutinefunction(getattr(type(obj), "connection", None)):  # AsyncSession
        obj = await obj.connection()
    if inspect.iscoroutinefunction(getattr(type(obj), "get_raw_connection", None)):
        # a SQLAlchemy AsyncConnection
        get_raw = obj.get_raw_connection
        in_tx = getattr(obj, "in_transaction", None)
        if callable(in_tx) and not in_tx():
            # A SQLAlchemy connection only commits what it knows it began: begin now so the
            # caller's commit() / rollback() covers the job written underneath.
            await obj.begin()
        raw = await get_raw()
        driver = getattr(raw, "driver_connection", None)
        if isinstance(driver, psycopg.AsyncConnection):
            return driver
        name = type(driver).__module__.split(".")[0]
        raise InvalidInput(f"connection= needs SQLAlchemy's psycopg (3) driver, not {name}: create "
                           "the engine with create_async_engine('postgresql+psycopg://...')")
    raise InvalidInput(
        "connection= takes a psycopg AsyncConnection, a SQLAlchemy AsyncConnection or an "
        f"AsyncSession using the psycopg driver, not {type(obj).__name__}"
    )
