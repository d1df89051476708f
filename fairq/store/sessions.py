"""The sync store's sessions: a psycopg pool on one schema, and the cursor every operation runs in.

Every statement runs under ``lock_timeout`` and ``statement_timeout`` so one stuck session
cannot stall every worker. On a direct connection the timeouts (and the planner settings) are
session settings given at connect time, so a claim or a finish is one round trip (a single
autocommit statement). Behind a transaction-mode pooler (``pooler=True``) session state does not
stick to a server connection, so each operation runs in an explicit transaction that sets them
with ``SET LOCAL`` semantics (four round trips).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row

from fairq import sql
from fairq.config import redact
from fairq.store.listen import channel_for
from fairq.store.loaders import adapt_connection
from fairq.store.planner import PLAN_CACHE_MODE, PLANNER_SETTINGS, SEARCH_PATH, planner_options
from fairq.store.pool import Pool


class StoreSessions:
    """The sync store's connections to one schema: a pool of sessions that carry fairq's
    timeouts, planner settings and loaders, and the cursor each operation runs in."""

    def __init__(
        self,
        dsn: str,
        schema: str,
        *,
        min_size: int = 1,
        max_size: int = 4,
        statement_timeout_ms: int = 30_000,
        lock_timeout_ms: int = 5_000,
        prepare_threshold: int | None = 5,
        open_pool: bool = True,
        application_name: str = "fairq",
        timeout: float = 30.0,
        pooler: bool = False,
        durable_commits: bool = True,
    ) -> None:
        self.dsn = dsn
        self.schema = schema
        self.channel = channel_for(schema)
        self.statement_timeout_ms = statement_timeout_ms
        self.lock_timeout_ms = lock_timeout_ms
        self.application_name = application_name[:63]
        self.pooler = pooler
        # Off only for writes a crash may undo without losing a job (the worker's finishes: an
        # undone finish leaves the job running under its lease, and the reaper runs it again).
        # Durable: whatever the server or role says (it may be remote_apply for a replica).
        self.synchronous_commit: str | None = None if durable_commits else "off"
        kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": prepare_threshold}
        if not pooler:
            kwargs["options"] = (f"-c statement_timeout={int(statement_timeout_ms)} "
                                 f"-c lock_timeout={int(lock_timeout_ms)} {SEARCH_PATH} "
                                 + planner_options())
            if not durable_commits:
                kwargs["options"] += " -c synchronous_commit=off"
        # Reconnects at least every second after an outage (fairq.store.pool).
        self.pool: Pool = Pool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            kwargs=kwargs,
            configure=self._configure,
            open=False,
            timeout=timeout,
            name=f"fairq-{schema}",
        )
        if open_pool:
            self.pool.open(wait=False)

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        adapt_connection(conn)
        # Behind a pooler this lands on whichever server connection serves it: cosmetic there.
        conn.execute(self.statement("label_session"), {"name": self.application_name})

    def close(self) -> None:
        self.pool.close()

    def drop_dead_connections(self) -> None:
        """Check every idle connection of the pool now (one empty statement each), dropping
        the dead ones and opening new ones in the background. Called after a lost connection:
        a killed session or a restarted server leaves every idle connection dead, and handing
        them out one failure at a time would cost a retry each."""
        self.pool.check()

    def describe(self) -> str:
        return f"{redact(self.dsn)} schema={self.schema}"

    def statement(self, name: str) -> str:
        """The text of the named statement ``name`` (``fairq/sql/*.sql``) for this store's
        schema."""
        return sql.statement(name, self.schema)

    @contextmanager
    def cursor(self, *, atomic: bool = False,
               raw: bool = False) -> Iterator[psycopg.Cursor[dict[str, Any]]]:
        """A dict-row cursor under the store's timeouts.

        Without ``atomic`` each statement is its own transaction: callers that run one statement
        (claims, finishes) pay one round trip. ``atomic`` wraps several statements in one.
        ``raw``: a RawCursor, for statements in positional form (``sql.positional``).
        """
        factory = psycopg.RawCursor if raw else psycopg.Cursor
        with self.pool.connection() as conn:
            if not self.pooler and not atomic:
                with factory(conn, row_factory=dict_row) as cur:
                    yield cur
                return
            with conn.transaction(), factory(conn, row_factory=dict_row) as cur:
                if self.pooler:
                    conn.execute(self.statement("transaction_settings"), {
                        "statement_timeout": str(self.statement_timeout_ms),
                        "lock_timeout": str(self.lock_timeout_ms),
                        "synchronous_commit": self.synchronous_commit,
                        "plan_cache_mode": PLAN_CACHE_MODE, **PLANNER_SETTINGS})
                yield cur
