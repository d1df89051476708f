"""LISTEN/NOTIFY wake-ups on a dedicated direct connection, in its own thread.

The enqueue statement notifies the schema's channel with the queue name at commit. The
listener turns those into calls of ``on_wake(queues)``; the worker then claims at once instead
of waiting for its fallback poll. Waiting for a notification sends nothing to the server, so an
idle worker's query rate stays bounded by its poll interval. LISTEN needs a session, so
this connection must not go through a transaction-mode pooler: it uses ``App.listen_dsn``.
Notifications sent while we were disconnected are lost; after every (re)connect the listener
reports all queues so the worker claims once, and the worker's fallback poll covers the rest.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading
from collections.abc import Callable, Collection

from fairq.runtime.outage import Outage, is_outage
from fairq.store.errors import DatabaseError
from fairq.store.listen import Notifications

log = logging.getLogger("fairq.listener")

MAX_RETRY_SECONDS = 5.0  # the longest wait between two attempts to listen again
ALL_QUEUES: frozenset[str] = frozenset()  # on_wake(ALL_QUEUES) means "maybe anything changed"


class Listener:
    """A thread holding one autocommit connection that LISTENs on ``channel``."""

    def __init__(
        self,
        dsn: str,
        channel: str,
        queues: Collection[str],
        on_wake: Callable[[frozenset[str]], None],
        *,
        application_name: str = "fairq-listener",
        max_backoff: float = 30.0,
        check_interval: float = 0.5,
        outage: Outage | None = None,
    ) -> None:
        self.dsn = dsn
        self.channel = channel
        self.queues = frozenset(queues)
        self.on_wake = on_wake
        self.application_name = application_name[:63]
        self.max_backoff = max_backoff
        self.check_interval = check_interval
        # The worker's connection state: a lost LISTEN session is one of its outage's lines,
        # not a line per attempt (fairq.runtime.outage).
        self.outage = outage
        self.connected = threading.Event()  # set while LISTEN is in effect (tests wait on it)
        self.reconnects = 0
        self._stop = threading.Event()
        # stop() writes to this pipe: the wait on the socket ends at once, not after up to
        # check_interval (a stopping worker, an empty `run(until_empty=True)`, waited it out).
        self._wake_r, self._wake_w = os.pipe()
        self._wake_open = True
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fairq-listener", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._wake_open:
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout)
        if self._wake_open and (self._thread is None or not self._thread.is_alive()):
            self._wake_open = False  # closed once: a second stop never closes a reused fd
            for fd in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                with Notifications(self.dsn, self.channel,
                                   application_name=self.application_name) as conn:
                    # Anything sent while we were away is lost: ask for a poll, before saying
                    # we listen, so that whoever waits for `connected` finds that poll asked for.
                    self.on_wake(ALL_QUEUES)
                    if failures:  # the worker's "back" line says it when it has one
                        log.log(logging.DEBUG if self.outage else logging.INFO,
                                "listener reconnected after %d failure(s)", failures)
                        self.reconnects += 1
                    failures = 0
                    if self.outage is not None:
                        self.outage.ok()
                    self.connected.set()
                    self._listen(conn)
            except DatabaseError as e:
                self.connected.clear()
                if self._stop.is_set():
                    return
                failures += 1
                # Capped low: until it is back, wake-ups wait for the poll.
                delay = min(self.max_backoff, MAX_RETRY_SECONDS, 0.2 * 2 ** min(failures, 10))
                delay *= random.uniform(0.5, 1.0)
                if self.outage is not None and is_outage(e):
                    # Not for the reaper's grace: LISTEN may use another URL (a pooler's
                    # listen_dsn) that failing must not stop this worker reaping.
                    self.outage.lost(e, delay, grace=False)
                else:  # one line when it fails, not one per attempt
                    level = logging.DEBUG if failures > 1 else logging.WARNING
                    log.log(level, "listener connection failed (%s); retrying in %.1fs",
                            type(e).__name__, delay)
                self._stop.wait(delay)
            finally:
                self.connected.clear()

    def _listen(self, conn: Notifications) -> None:
        while not self._stop.is_set():
            # A client-side wait on the socket: nothing is sent to the server. Each note is
            # passed on as it arrives; the timeout only bounds how late stop() is seen.
            for queue in conn.payloads(timeout=self.check_interval, wake=self._wake_r):
                if not self.queues or queue in self.queues:
                    self.on_wake(frozenset((queue,)))
                if self._stop.is_set():
                    return
