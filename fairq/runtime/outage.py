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

A stall is an outage too, for that grace (decision 019): a server frozen (SIGSTOP, a hung VM,
storage that stops answering) or a network that holds packets loses no connection, yet no lease
is renewed while it lasts. A thread that times its statements (``calling()`` before them,
``ok()`` after) and took longer than ``STALL_FRACTION`` of the grace restarts the grace from
their end, and while such statements are still waiting ``connected_for`` is 0.
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
# Statements that took longer than this share of the reaper's grace (1.25 s of the default 5 s)
# count as an outage for the grace (decision 019). Far above a healthy round trip (a claim or a
# heartbeat takes milliseconds; a lock wait long enough to matter is rare), and below 2/3 of a
# 2 s lease: a live worker renews at a third of the lease, so a stall shorter than that cannot
# let a renewed lease expire. Relative to the grace, not to a lease: the reaper returns every
# worker's leases, whose lengths it does not know, and with a grace of 0 nothing waits anyway.
STALL_FRACTION = 0.25


def is_outage(error: BaseException) -> bool:
    """Whether ``error`` says the database (or the way to it) went away, not a statement's
    failure (a deadlock or a timeout)."""
    return error_kind(error) in OUTAGE_KINDS


class Outage:
    """The connection state of one process (thread-safe)."""

    def __init__(self, log: logging.Logger, *, on_reconnect: Callable[[], None] | None = None,
                 settle: float = SETTLE_SECONDS, grace: float = REAP_GRACE_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = log
        self._on_reconnect = on_reconnect
        self._settle = settle
        self._clock = clock
        # Statements slower than this are a stall (None: the grace is 0, nothing waits for it).
        self.grace = grace
        self.stall: float | None = grace * STALL_FRACTION if grace > 0 else None
        self._calls: dict[int, float] = {}  # thread -> when its timed statements began
        self._ended = -float("inf")  # when the last outage ended (its "back" line)
        self._stall_logged = -float("inf")  # end of the last stall logged
        self.stalls = 0
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
            self._calls.pop(threading.get_ident(), None)
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
        database was away (until its first answer). Ends the calling thread's timed statements
        (``calling()``): slower than ``stall``, they restart the reaper's grace from now."""
        now = self._clock()
        stalled: float | None = None
        took, failures = 0.0, 0
        with self._lock:
            began = self._calls.pop(threading.get_ident(), None)
            if began is not None and self.stall is not None and now - began > self.stall:
                # A stall: leases went unrenewed for as long; the grace starts again now. Said
                # once per stall (every thread's statements end with it), and not as a stall
                # when an outage explains it.
                self.stalls += 1
                self._connected_since = now
                if (self._down_since is None and began > max(self._last_error, self._ended)
                        and began > self._stall_logged):
                    self._stall_logged = now
                    stalled = now - began
            if self._answered is None:
                self._answered = now
            if self._connected_since is None:
                self._connected_since = now
            back = self._down_since is not None and (now - self._last_error >= self._settle
                                                     or settled)
            if back and self._down_since is not None:
                took = self._answered - self._down_since
                failures, self._failures = self._failures, 0
                self._down_since = None
                self._ended = now
                self.reconnects += 1
        if stalled is not None:
            self._log.warning("the database took %.1fs to answer (a stalled server or network?): "
                              "counted as an outage, this process reaps no lease for %gs",
                              stalled, self.grace)
        if not back:
            return
        self._log.warning("database connection back after %.1fs (%d failed attempt(s))", took,
                          failures)
        if self._on_reconnect is not None:
            self._on_reconnect()

    def calling(self) -> None:
        """The calling thread starts statements it will time: ``ok()`` after them judges how long
        they took; ``lost()``, ``idle()`` or the thread's next ``calling()`` ends them unjudged
        (the claim loop's next turn does, after an error that is not an outage)."""
        now = self._clock()
        with self._lock:
            self._calls[threading.get_ident()] = now

    def idle(self) -> None:
        """The calling thread's timed statements ended without an answer to judge (an error
        that is not an outage, a bug); a no-op after ``ok()`` or ``lost()``."""
        with self._lock:
            self._calls.pop(threading.get_ident(), None)

    def stopping(self) -> None:
        """The process stops: an outage the database has answered since is over, say so."""
        with self._lock:
            answered = self._down_since is not None and self._answered is not None
        if answered:
            self.ok(settled=True)

    def may_reap(self) -> bool:
        """Connected for the grace: live workers renewed their leases (decisions 016, 019)."""
        return self.connected_for() >= self.grace

    def connected_for(self) -> float:
        """Seconds since this process last lost a connection or met a stall, or since its first
        success; 0 while it has no connection (or never had one), and while statements of one
        of its threads have been waiting longer than a stall."""
        now = self._clock()
        with self._lock:
            since = self._connected_since
            began = min(self._calls.values(), default=now)
        if since is None or (self.stall is not None and now - began > self.stall):
            return 0.0
        return max(0.0, now - since)
