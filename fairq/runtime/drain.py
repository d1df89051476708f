"""Ending a worker: the graceful stop (hand back unstarted jobs, let running ones finish within
the grace period, hand back the rest) and the test ``run(until_empty=True)`` ends on.

The until-empty rule: the worker ends once nothing of its own runs or waits to be written and a
claim over all its queues finds nothing, except while a due job waits only for its tenant's next
token (a rate limit): time alone makes that job claimable, so the worker sleeps until the
earliest such token and goes on. Jobs delayed to a future ``run_at``, tenants at their cap
(jobs running elsewhere) and paused tenants (cap 0) do not keep it running.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from fairq.job import Job
from fairq.observe import WorkerObserver
from fairq.runtime.finisher import Finisher
from fairq.runtime.heartbeats import Heartbeats
from fairq.runtime.maintenance import reap_and_report
from fairq.runtime.slots import Slots
from fairq.runtime.state import Running, Shared, log
from fairq.store import Store
from fairq.store.errors import DatabaseError, PoolTimeout
from fairq.store.workers import expired_lease_exists

MIN_WAKE_SECONDS = 0.01  # a wake-up due now still waits this long: the loop never spins


class Drain:
    """The two ways a worker's run ends, over the parts it stops."""

    def __init__(self, shared: Shared, slots: Slots, finisher: Finisher, heartbeats: Heartbeats,
                 observer: WorkerObserver, worker_id: str, reap_grace: float = 0.0) -> None:
        self.shared = shared
        self.reap_grace = reap_grace
        self.slots = slots
        self.finisher = finisher
        self.heartbeats = heartbeats
        self.observer = observer
        self.worker_id = worker_id

    def empty(self, store: Store, queues: Sequence[str], claimed: int, poll: bool,
              claim_round: Callable[[Store, bool], int]) -> bool:
        """Whether ``run(until_empty=True)`` is done (the rule in this module's docstring).

        A fair claim comes back empty only when no tenant it could lock has a due job under its
        cap and with a token (docs/algorithm.md). Expired leases are returned first, so a drain
        does not end with a dead worker's jobs still ``running``; a job they hand back is
        claimed like any other. Nor with its own: a job still running under this worker's lease
        while nothing of it runs here was claimed but never reached it (a claim whose rows
        could not be read), and the drain goes on until that lease expires and it is reaped.
        """
        sh = self.shared
        with sh.lock:
            if claimed or not poll or not sh.settled():
                return False
        wait = self.reap_grace - sh.outage.connected_for()
        if wait > 0:  # not connected long enough to reap (decision 016)
            if expired_lease_exists(store):  # look again then
                sh.wake_tenants_at(time.monotonic() + max(MIN_WAKE_SECONDS, wait))
                return False
        elif reap_and_report(store, self.observer, stall=sh.outage.stall).total:
            return False
        stranded, expires_in = store.held_running(self.worker_id)
        if stranded:
            log.warning("worker %s: %d job(s) claimed by this worker never reached it; waiting "
                        "%.1fs for their leases to expire", self.worker_id, stranded,
                        max(0.0, expires_in))
            sh.wake_tenants_at(time.monotonic() + max(MIN_WAKE_SECONDS, expires_in))
            return False
        if claim_round(store, True):
            return False
        token = store.next_token(queues)
        if token is not None:  # a rate-limited tenant's due job: claimable at its next token
            sh.wake_tenants_at(time.monotonic() + max(MIN_WAKE_SECONDS, token))
            return False
        if store.runnable_exists(queues):
            log.info("worker %s: due jobs remain but none may be claimed: their tenants are at "
                     "their caps or paused", self.worker_id)
        return True

    def graceful(self, store: Store, grace_period: float) -> None:
        """Graceful stop: hand back unstarted jobs, let in-flight ones finish within grace."""
        sh = self.shared
        deadline = time.monotonic() + grace_period
        unstarted = self.slots.take_unstarted()
        with sh.lock:
            for job in unstarted:
                sh.inflight.pop((job.id, job.attempt), None)
        if unstarted:
            self._retry_until(deadline, lambda: self._release(store, unstarted))
        while True:
            sh.wake.clear()  # before looking, so that a wake-up after the look is not lost
            self._retry_until(deadline, lambda: self._finish_and_heartbeat(store))
            with sh.lock:
                if sh.settled():
                    return
                next_hb = min((r.next_extend for r in sh.inflight.values()), default=deadline)
            if time.monotonic() >= deadline:
                break
            sh.wake.wait(max(0.0, min(deadline, next_hb) - time.monotonic()))
        with sh.lock:
            left = list(sh.inflight.values())
            sh.inflight.clear()
        if left:
            log.warning("grace period of %gs over: handing back %d running job(s); their "
                        "handlers go on running in this process until it exits",
                        grace_period, len(left))
            sh.stats.abandoned += len(left)
            self._retry_until(time.monotonic() + 5.0,
                              lambda: self._hand_back(store, left, grace_period))

    def _finish_and_heartbeat(self, store: Store) -> None:
        self.finisher.finish_completions(store)
        self.heartbeats.beat(store, time.monotonic())

    def _release(self, store: Store, jobs: list[Job]) -> None:
        released = store.release_unstarted([(j.id, j.attempt) for j in jobs],
                                           started=[j.started_at for j in jobs])
        self.shared.stats.released += len(released)
        log.info("handed back %d claimed job(s) that had not started", len(released))

    def _hand_back(self, store: Store, left: list[Running], grace_period: float) -> None:
        """Hand back jobs still running after the grace period (jobs.sql, hand_back_running):
        queued again with the interrupted attempt not counted, unless the previous stop
        interrupted them too. Their handlers are not stopped (a thread cannot be); what they do
        from now on is written nowhere: their completions are dropped (Slots.complete), and
        ``job.lease_lost`` tells a handler that looks that the attempt is no longer its own."""
        now = time.monotonic()
        note = f"worker {self.worker_id} stopped after a grace period of {grace_period:g}s"
        outcomes = store.hand_back_running([(r.job.id, r.job.attempt) for r in left],
                                           [note] * len(left), [now - r.started for r in left],
                                           started=[r.job.started_at for r in left])
        for r in left:
            r.job.lease_lost = True
            outcome = outcomes.get(r.job.id, "lease_lost")
            if outcome == "handed_back":
                continue
            # A counted attempt is a finish as the metrics see it; so is one no longer ours.
            self.shared.count(outcome)
            self.observer.on_finish(r.job.claimed, outcome, now - r.started)
            if outcome == "lease_lost":
                log.warning("job %d attempt %d: lease lost before it was handed back; nothing "
                            "changed", r.job.id, r.job.attempt)
            else:
                log.warning("job %d handed back with attempt %d of %d counted (%s): the previous "
                            "stop interrupted it too", r.job.id, r.job.attempt,
                            r.job.max_attempts, "queued again" if outcome == "retry"
                            else "failed for good")
        free = sum(1 for o in outcomes.values() if o == "handed_back")
        log.info("handed back %d running job(s) without counting their attempt", free)

    def _retry_until(self, deadline: float, action: Callable[[], object]) -> None:
        """Run ``action`` until it succeeds or ``deadline`` passes (database errors only)."""
        failures = 0
        while True:
            try:
                action()
                return
            except (DatabaseError, PoolTimeout) as e:
                failures += 1
                if time.monotonic() >= deadline:
                    log.warning("giving up during shutdown (%s); leases will expire", e)
                    return
                time.sleep(min(1.0, 0.05 * 2 ** failures))
