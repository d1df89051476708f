"""The store's LISTEN session: one dedicated autocommit connection that waits for the wake-ups
the enqueue statement sends at commit (``NOTIFY`` on the schema's channel, the queue name as
payload). LISTEN needs a session of its own, so it must not go through a transaction-mode
pooler. What to do with a wake-up, and reconnecting, are the runtime's (fairq.runtime.listener)."""

from __future__ import annotations

import select
from collections.abc import Iterator
from types import TracebackType

import psycopg
from psycopg import sql as pgsql


def channel_for(schema: str) -> str:
    """The LISTEN/NOTIFY channel of a schema: wake-ups carry the queue name only."""
    return f"fairq_{schema}"


class Notifications:
    """A connection listening on ``channel`` from construction until ``close()``."""

    def __init__(self, dsn: str, channel: str, *, application_name: str) -> None:
        self._conn: psycopg.Connection[tuple[object, ...]] = psycopg.connect(
            dsn, autocommit=True, application_name=application_name[:63])
        try:
            # A channel is an identifier: LISTEN takes no parameter.
            self._conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(channel)))
        except BaseException:
            self._conn.close()
            raise

    def payloads(self, timeout: float, wake: int | None = None) -> Iterator[str]:
        """The payloads of the notifications that arrive within ``timeout`` seconds, each as it
        arrives. A client-side wait on the socket: nothing is sent to the server. ``wake``: a
        file descriptor whose becoming readable ends the wait at once (a stopping worker's)."""
        if wake is None:
            for note in self._conn.notifies(timeout=timeout):
                yield note.payload
            return
        yield from self._pending()
        ready, _, _ = select.select([self._conn.fileno(), wake], [], [], timeout)
        if self._conn.fileno() in ready:
            yield from self._pending()

    def _pending(self) -> Iterator[str]:
        """The notifications already received or readable now, without waiting."""
        for note in self._conn.notifies(timeout=0):
            yield note.payload

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Notifications:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
