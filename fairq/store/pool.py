"""psycopg_pool's pools, made to come back quickly after an outage (docs/reliability.md,
"Outages").

psycopg_pool retries a failed connection attempt after 1 s, then doubles the wait without a cap
(until ``reconnect_timeout``, 5 minutes): after a 30 s outage its next attempt could come 30 s
after the server was back, and every ``App.enqueue`` and worker statement waited for it. These
pools wait at most ``POOL_RECONNECT_CAP`` seconds between attempts (jittered, so that a hundred
processes do not all knock at once).

An idle connection whose server went away (a restart, a killed session, a pooler's restart)
has something to read: the server's last error, or the end of the stream. ``check_idle`` looks
at the socket without a round trip when the pool hands a connection out; on such a connection
it drops every dead idle connection of the pool at once, so a producer's first statement after
an outage runs on a live session instead of failing on a dead one.
"""

from __future__ import annotations

import random
import select
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool
from psycopg_pool.pool import AddConnection
from psycopg_pool.pool_async import AddConnection as AsyncAddConnection

POOL_RECONNECT_CAP = 1.0  # the longest wait between two connection attempts (seconds)


def reconnect_delay(delay: float) -> float:
    """psycopg_pool's backoff ``delay``, capped at ``POOL_RECONNECT_CAP`` (jittered)."""
    return min(delay, POOL_RECONNECT_CAP * random.uniform(0.5, 1.0))


def readable(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether an idle connection has something to read: the server ended it (or sent an
    error). No round trip: a poll of the socket."""
    try:
        ready, _, _ = select.select([conn.pgconn.socket], [], [], 0)
    except (OSError, ValueError, psycopg.OperationalError):
        return True
    return bool(ready)


class Pool(ConnectionPool[psycopg.Connection[Any]]):
    """A ConnectionPool that reconnects at least every ``POOL_RECONNECT_CAP`` seconds and does
    not hand out connections the server has ended."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, check=self._check_idle, **kwargs)
        # Told when an idle connection was found ended: the server may have restarted (or
        # crashed) without any statement failing (the worker then writes its recent finishes
        # again: fairq.runtime.finisher).
        self.on_lost: Callable[[], None] | None = None

    def schedule_task(self, task: Any, delay: float) -> None:
        if isinstance(task, AddConnection):
            delay = reconnect_delay(delay)
        super().schedule_task(task, delay)

    def _check_idle(self, conn: psycopg.Connection[Any]) -> None:
        """The pool's check when it hands ``conn`` out: nothing to do unless the server ended it;
        then every idle connection is checked (the dead ones dropped), and ``conn`` fails its
        check (the pool then gives another)."""
        if not readable(conn):
            return
        try:
            ConnectionPool.check_connection(conn)
        except Exception:
            if self.on_lost is not None:
                self.on_lost()
            raise
        finally:
            self.check()


class AsyncPool(AsyncConnectionPool[psycopg.AsyncConnection[Any]]):
    """The asyncio twin of ``Pool``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, check=self._check_idle, **kwargs)

    async def schedule_task(self, task: Any, delay: float) -> None:
        if isinstance(task, AsyncAddConnection):
            delay = reconnect_delay(delay)
        await super().schedule_task(task, delay)

    async def _check_idle(self, conn: psycopg.AsyncConnection[Any]) -> None:
        if not readable(conn):
            return
        try:
            await AsyncConnectionPool.check_connection(conn)
        finally:
            await self.check()
