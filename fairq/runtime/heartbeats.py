"""Heartbeats: the leases of running jobs (and of finished ones not written yet) are extended
on a thread and a connection of their own, so a claim waiting for a lock, or any slow statement
of the control thread, cannot let them expire."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

from fairq.job import Job
from fairq.models import ClaimedJob
from fairq.runtime.background import Background
from fairq.runtime.outage import is_outage
from fairq.runtime.state import Shared, log
from fairq.store import Store
from fairq.store.errors import DatabaseError, LockNotAvailable, PoolTimeout


class Heartbeats:
    """The heartbeat thread; ``beat`` is also called by the graceful stop."""

    def __init__(self, shared: Shared, store: Callable[[], Store],
                 interval: float | None) -> None:
        self.shared = shared
        self._store = store
        self.interval = interval
        self._background = Background("fairq-heartbeat", self._loop, shared.heartbeat_wake)
        self._exit = self._background.exit

    def every(self, job: Job) -> float:
        """Seconds between two extensions of ``job``'s lease: a third of it unless set."""
        return self.interval or max(0.1, job.lease_seconds / 3.0)

    def count_from(self, jobs: Sequence[ClaimedJob], sent: float) -> None:
        """Count the heartbeats of a claim's leases from when it was sent (monotonic), not from
        its answer: its now(), where the leases start, is no earlier. So a claim that took long
        (one a stalled server answers with leases computed before the stall: expired, or
        nearly) has them renewed at once, not a third of a lease later (decision 019)."""
        sh = self.shared
        sooner = False
        with sh.lock:
            for c in jobs:
                r = sh.inflight.get((c.id, c.attempts)) or sh.unwritten.get((c.id, c.attempts))
                if r is not None and sent + self.every(r.job) < r.next_extend:
                    r.next_extend = sent + self.every(r.job)
                    sooner = True
        if sooner:
            sh.heartbeat_wake.set()

    def start(self) -> None:
        self._background.start()

    def stop(self) -> None:
        self._background.stop()

    def _loop(self) -> None:
        """Extend the leases of running jobs when they are due, whatever the control thread is
        waiting for."""
        sh = self.shared
        failures = 0
        while not self._exit.is_set():
            with sh.lock:
                due = min((r.next_extend for r in (*sh.inflight.values(),
                                                   *sh.unwritten.values())), default=None)
            now = time.monotonic()
            if due is None or due > now:
                sh.heartbeat_wake.wait(None if due is None else due - now)
                sh.heartbeat_wake.clear()  # the next turn looks again: nothing is lost
                continue
            try:
                sh.outage.calling()  # timed: a stalled database is an outage (decision 019)
                self.beat(self._store(), now)
                failures = 0
                sh.outage.ok()
            except (DatabaseError, PoolTimeout) as e:
                sh.outage.idle()
                failures += 1
                delay = min(1.0, 0.05 * 2 ** min(failures, 5))  # a lease is at stake: retry soon
                delay *= random.uniform(0.5, 1.0)
                if is_outage(e):
                    sh.outage.lost(e, delay)  # one line per outage (outage.py)
                else:
                    what = ("lock timeout" if isinstance(e, LockNotAvailable)
                            else type(e).__name__)
                    log.warning("extending leases failed (%s: %s); retrying in %.2fs", what,
                                str(e).strip()[:200], delay)
                self._exit.wait(delay)
            except Exception:  # a bug must not stop the heartbeats
                sh.outage.idle()
                log.exception("heartbeat error; retrying in 1s")
                self._exit.wait(1.0)

    def beat(self, store: Store, now: float) -> None:
        """Extend the leases due by ``now``; a job whose lease is gone is marked lost."""
        sh = self.shared
        with sh.lock:
            due = [r for r in sh.inflight.values() if r.next_extend <= now]
            done = [r for r in sh.unwritten.values() if r.next_extend <= now]
        if not due and not done:
            return
        held = [*due, *done]
        ours = store.extend_leases([(r.job.id, r.job.attempt) for r in held],
                                   started=[r.job.started_at for r in held])
        for r in done:
            r.next_extend = now + self.every(r.job)
            if r.job.id not in ours:  # its finish will find the lease lost and say so
                with sh.lock:
                    sh.unwritten.pop((r.job.id, r.job.attempt), None)
        for r in due:
            r.next_extend = now + self.every(r.job)
            if r.job.id not in ours and not r.job.lease_lost:
                r.job.lease_lost = True
                log.warning("job %d attempt %d: lease lost while running (reaped, re-claimed or "
                            "cancelled elsewhere)", r.job.id, r.job.attempt)
