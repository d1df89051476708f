"""The store's asyncio part: the producers' and readers' operations (enqueue, a job, cancel,
tenants) for async code, with the same named statements as the sync ``Store`` (``store.pg``).

With ``connection=`` (a psycopg ``AsyncConnection``, a SQLAlchemy ``AsyncConnection`` or
``AsyncSession``) the statement runs in the caller's transaction, so the job commits or rolls
back with it. Without, each operation takes a connection from a small async pool, opened on
first use in the running event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, nullcontext
from typing import Any

import psycopg
from psycopg.rows import dict_row

from fairq import sql
from fairq.models import JobInfo, NewJobColumns, TenantConfig, TraceContext
from fairq.store.caller_connection import async_connection_for
from fairq.store.enqueue import CHUNK, as_invalid_input
from fairq.store.planner import PLAN_CACHE_MODE, PLANNER_SETTINGS, SEARCH_PATH, planner_options
from fairq.store.pool import AsyncPool
from fairq.store.traces import check_trace, enqueue_call


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
                                       f"-c lock_timeout={int(lock_timeout_ms)} {SEARCH_PATH} "
                                       + planner_options())
        self._pool: AsyncPool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def statement(self, name: str) -> str:
        """The text of the named statement ``name`` for this store's schema."""
        return sql.statement(name, self.schema)

    async def _get_pool(self) -> AsyncPool:
        loop = asyncio.get_running_loop()
        if self._pool is None or self._loop is not loop:
            # A pool belongs to the event loop that opened it (asyncio.run makes a new one).
            self._pool = AsyncPool(self.dsn, min_size=1, max_size=self._max_size,
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
                await conn.execute(self.statement("transaction_settings"), {
                    **self._timeouts, "synchronous_commit": None,
                    "plan_cache_mode": PLAN_CACHE_MODE, **PLANNER_SETTINGS})
                yield conn

    async def enqueue(self, jobs: NewJobColumns, connection: Any = None, *,
                      trace: TraceContext | None = None) -> list[int]:
        """Insert ``jobs`` (one round trip per chunk); in ``connection``'s transaction if given,
        else all chunks in one transaction of their own. With ``trace``, each job's row in
        job_traces is written by the statement that inserts it."""
        if trace is not None:
            check_trace(trace)
        ids: list[int] = []
        async with self._conn(connection) as conn:
            atomic = connection is None and len(jobs) > CHUNK  # all chunks or none
            async with conn.transaction() if atomic else nullcontext(), conn.cursor() as cur:
                for start in range(0, len(jobs), CHUNK):
                    name, params = enqueue_call(jobs.chunk(start, start + CHUNK), trace)
                    try:
                        await cur.execute(self.statement(name), params)
                    except psycopg.Error as exc:
                        raise as_invalid_input(exc) from None
                    row = await cur.fetchone()
                    ids.extend(list(row[0] or []) if row else [])
        return ids

    async def get_job(self, job_id: int, connection: Any = None) -> JobInfo | None:
        async with self._conn(connection) as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(self.statement("get_job"), {"id": job_id})
            row = await cur.fetchone()
        return JobInfo(**row) if row else None

    async def cancel(self, job_id: int, connection: Any = None) -> bool:
        async with self._conn(connection) as conn, conn.cursor() as cur:
            await cur.execute(self.statement("cancel"), {"id": job_id})
            return await cur.fetchone() is not None

    async def get_tenant(self, tenant: str, connection: Any = None) -> TenantConfig:
        async with self._conn(connection) as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(self.statement("get_tenant"), {"tenant": tenant})
            row = await cur.fetchone()
            if row is not None:
                return TenantConfig(**row)
            await cur.execute(self.statement("get_defaults"))
            defaults = await cur.fetchone()
        weight, max_running = ((float(defaults["weight"]), int(defaults["max_running"]))
                               if defaults else (1.0, 10))
        return TenantConfig(tenant, weight, max_running, configured=False)

    async def list_tenants(self, connection: Any = None) -> list[TenantConfig]:
        async with self._conn(connection) as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(self.statement("list_tenants"))
            return [TenantConfig(**r) for r in await cur.fetchall()]
