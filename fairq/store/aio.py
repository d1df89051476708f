"""The store's asyncio part: the producers' and readers' operations (enqueue, a job, cancel,
tenants) for async code, with the same named statements as ``store.pg``.

With ``connection=`` (a psycopg ``AsyncConnection``, a SQLAlchemy ``AsyncConnection`` or
``AsyncSession``) the statement runs in the caller's transaction, so the job commits or rolls
back with it. Without, each operation takes a connection from a small async pool, opened on
first use in the running event loop.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, nullcontext
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from fairq import sql
from fairq.errors import InvalidInput
from fairq.models import JobInfo, NewJobColumns, TenantConfig
from fairq.store.pg import (
    CHUNK,
    PLAN_CACHE_MODE,
    PLANNER_SETTINGS,
    _invalid_input,
    enqueue_params,
    planner_options,
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


class AsyncStore:
    """fairq's producer and reader operations on one schema, for asyncio."""

    def __init__(self, dsn: str, schema: str, *, max_size: int = 4,
                 statement_timeout_ms: int = 30_000, lock_timeout_ms: int = 5_000,
                 prepare_threshold: int | None = 5, pooler: bool = False) -> None:
        self.dsn = dsn
        self.schema = schema
        self._max_size = max_size
        self.pooler = pooler
        self._timeouts = {"statement_timeout": str(statement_timeout_ms),
                          "lock_timeout": str(lock_timeout_ms)}
        self._kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": prepare_threshold}
        if not pooler:  # behind a transaction pooler session settings do not stick
            self._kwargs["options"] = (f"-c statement_timeout={int(statement_timeout_ms)} "
                                       f"-c lock_timeout={int(lock_timeout_ms)} "
                                       + planner_options())
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def q(self, name: str) -> str:
        return sql.statement(name, self.schema)

    async def _get_pool(self) -> AsyncConnectionPool[psycopg.AsyncConnection[Any]]:
        loop = asyncio.get_running_loop()
        if self._pool is None or self._loop is not loop:
            # A pool belongs to the event loop that opened it (asyncio.run makes a new one).
            self._pool = AsyncConnectionPool(self.dsn, min_size=1, max_size=self._max_size,
                                             kwargs=self._kwargs, open=False,
                                             name=f"fairq-async-{self.schema}")
            self._loop = loop
            await self._pool.open()
        return self._pool

    async def close(self) -> None:
        if self._pool is not None and self._loop is asyncio.get_running_loop():
            await self._pool.close()
        self._pool = self._loop = None

    @asynccontextmanager
    async def _conn(self, connection: Any) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        if connection is not None:
            yield await async_connection_for(connection)
            return
        pool = await self._get_pool()
        async with pool.connection() as conn:
            if not self.pooler:
                yield conn
                return
            # Behind a transaction pooler: the timeouts as SET LOCAL, in a transaction of its own.
            async with conn.transaction():
                await conn.execute(self.q("transaction_settings"), {
                    **self._timeouts, "synchronous_commit": None,
                    "plan_cache_mode": PLAN_CACHE_MODE, **PLANNER_SETTINGS})
                yield conn

    async def enqueue(self, jobs: NewJobColumns, connection: Any = None) -> list[int]:
        """Insert ``jobs`` (one round trip per chunk); in ``connection``'s transaction if given,
        else all chunks in one transaction of their own."""
        ids: list[int] = []
        async with self._conn(connection) as conn:
            atomic = connection is None and len(jobs) > CHUNK  # all chunks or none
            async with conn.transaction() if atomic else nullcontext(), conn.cursor() as cur:
                for start in range(0, len(jobs), CHUNK):
                    try:
                        await cur.execute(self.q("enqueue"),
                                          enqueue_params(jobs.chunk(start, start + CHUNK)))
                    except psycopg.Error as exc:
                        raise _invalid_input(exc) from None
                    row = await cur.fetchone()
                    ids.extend(list(row[0] or []) if row else [])
        return ids

    async def get_job(self, job_id: int, connection: Any = None) -> JobInfo | None:
        async with self._conn(connection) as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(self.q("get_job"), {"id": job_id})
            row = await cur.fetchone()
        return JobInfo(**row) if row else None

    async def cancel(self, job_id: int, connection: Any = None) -> bool:
        async with self._conn(connection) as conn, conn.cursor() as cur:
            await cur.execute(self.q("cancel"), {"id": job_id})
            return await cur.fetchone() is not None

    async def get_tenant(self, tenant: str, connection: Any = None) -> TenantConfig:
        async with self._conn(connection) as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(self.q("get_tenant"), {"tenant": tenant})
            row = await cur.fetchone()
            if row is not None:
                return TenantConfig(**row)
            await cur.execute(self.q("get_defaults"))
            d = await cur.fetchone()
        weight, max_running = (float(d["weight"]), int(d["max_running"])) if d else (1.0, 10)
        return TenantConfig(tenant, weight, max_running, configured=False)

    async def list_tenants(self, connection: Any = None) -> list[TenantConfig]:
        async with self._conn(connection) as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(self.q("list_tenants"))
            return [TenantConfig(**r) for r in await cur.fetchall()]
