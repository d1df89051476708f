"""A process's view of its database connection: lost, back, and for how long it has been
connected (docs/reliability.md, "Outages"; decision 016).

Every thread of a worker (the claim loop, the finisher, the heartbeats) and the exporter report
here what their statements met. An outage is logged as two lines, whatever the number of
threads, connections and failed attempts: one when the first statement fails for a lost
connection (with the wait before the next try), one when the database answers again, with how
long it was away. A storm of killed sessions is one outage until no connection has been lost for
``SETTLE_SECONDS``. Each outage that ends is counted (``fairq_db_reconnects_total``).

``connected_for`` is what the reaper asks before returning expired leases: after an outage no
worker could renew its leases, and a live worker renews them within seconds of reconnecting, so
a reaper waits until its own process has been connected for ``REAP_GRACE_SECONDS``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from fairq.store.errors import error_kind

# A connection error within this many seconds of the last keeps the outage open: a storm of
# killed sessions is one outage, not one per session.
SETTLE_SECONDS = 1.0
# How long a process must have been connected without losing a connection before its reaper
# returns expired leases. A live worker renews its due leases within about 2 s of the server
# answering again (the pools try to connect at least every POOL_RECONNECT_CAP seconds, the
# heartbeats retry within 1 s): 5 s covers that with a margin on a loaded box.
REAP_GRACE_SECONDS = 5.0
OUTAGE_KINDS = frozenset({"admin_shutdown", "connection_lost", "pool_timeout"})


def is_outage(error: BaseException) -> bool:
    """Whether ``error`` says the database (or the way to it) went away, not a statement's
    failure (a deadlock or a timeout)."""
    return error_kind(error) in OUTAGE_KINDS


class Outage:
    """The connection state of one process (thread-safe)."""

    def __init__(self, log: logging.Logger, *, on_reconnect: Callable[[], None] | None = None,
                 settle: float = SETTLE_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = log
        self._on_reconnect = on_reconnect
        self._settle = settle
        self._clock = clock
        self._lock = threading.Lock()
        self._down_since: float | None = None  # first error of the open outage
        self._last_error = -float("inf")
        self._answered: float | None = None  # first success after the last error
        self._connected_since: float | None = None  # None: never connected yet
        self._failures = 0
        self.reconnects = 0

    @property
    def down(self) -> bool:
        """An outage is open (its end not logged yet)."""
        with self._lock:
            return self._down_since is not None

    def lost(self, error: BaseException, next_try: float, *, grace: bool = True) -> bool:
        """A statement failed because the connection or the server went away; the caller tries
        again in ``next_try`` seconds. Logs the outage's first line; returns True then (later
        failures of the same outage are for the debug log only). ``grace=False``: the error
        does not restart the reaper's grace (``connected_for``)."""
        now = self._clock()
        with self._lock:
            self._last_error = now
            self._answered = None
            if grace:
                self._connected_since = None
            self._failures += 1
            first = self._down_since is None
            if first:
                self._down_since = now
        text = str(error).strip()
        detail = text.splitlines()[0][:200] if text else type(error).__name__
        if first:
            self._log.warning("database connection lost (%s: %s); reconnecting with backoff, "
                              "next attempt in %.2fs", error_kind(error), detail, next_try)
        else:
            self._log.debug("still no database (%s); next attempt in %.2fs", detail, next_try)
        return first

    def ok(self, *, settled: bool = False) -> None:
        """A statement succeeded. Ends an open outage once no connection was lost for
        ``settle`` seconds (or now, ``settled``: the process stops), logging how long the
        database was away (until its first answer)."""
        now = self._clock()
        with self._lock:
            if self._answered is None:
                self._answered = now
            if self._connected_since is None:
                self._connected_since = now
            if self._down_since is None or (now - self._last_error < self._settle
                                            and not settled):
                return
            took = self._answered - self._down_since
            failures, self._failures = self._failures, 0
            self._down_since = None
            self.reconnects += 1
        self._log.warning("database connection back after %.1fs (%d failed attempt(s))", took,
                          failures)
        if self._on_reconnect is not None:
            self._on_reconnect()

    def stopping(self) -> None:
        """The process stops: an outage the database has answered since is over, say so."""
        with self._lock:
            answered = self._down_since is not None and self._answered is not None
        if answered:
            self.ok(settled=True)

    def connected_for(self) -> float:
        """Seconds since this process last lost a connection, or since its first success; 0
        while it has no connection (or never had one)."""
        with self._lock:
            since = self._connected_since
        return 0.0 if since is None else max(0.0, self._clock() - since)
