"""The worker: claim under a policy into free slots, heartbeat leases, run maintenance.

One control thread (the caller of ``run()``) claims into the free slots and runs maintenance.
While handlers are short it also claims ahead of them (``WorkerSettings.ahead``, at most as
many as the slots), so that a claim fills a batch (its statement costs the server about as much
for one job as for dozens) and a slot freed during a claim's round trip finds a job waiting:
those jobs are claimed in the database (they count against caps and rates, their leases are
kept), wait locally for at most one job's run, and a graceful stop hands back those not
started. The slots (``slots.py``) run handlers outside any transaction; a finisher thread
(``finisher.py``) writes completed jobs in batches on its own connection, so a finish overlaps
the next claim instead of delaying it: with short jobs the loop's round trips are then claims
only; a heartbeat thread (``heartbeats.py``) keeps the leases. A crash between a handler's
return and its batched finish makes the job run again, never lost. ``drain.py`` ends a run.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import threading
import time
from collections.abc import Mapping
from typing import ClassVar

from fairq.errors import InvalidInput
from fairq.models import ClaimedJob
from fairq.observe import NullObserver, WorkerObserver
from fairq.runtime.db_errors import observe, observe_reconnect, quiet_pool_logs, react
from fairq.runtime.drain import MIN_WAKE_SECONDS, Drain
from fairq.runtime.failure_log import FailureLog
from fairq.runtime.finisher import Finisher
from fairq.runtime.heartbeats import Heartbeats
from fairq.runtime.listener import Listener
from fairq.runtime.maintenance import (
    DueWaker,
    MaintenanceSchedule,
    PeriodicScheduler,
    Pruner,
    Reaper,
    ReturnsSweep,
    ScheduleRepair,
    ScheduleVacuum,
    Service,
    StrandedWaker,
    UsageDecay,
    VtimeRebase,
)
from fairq.runtime.outage import OUTAGE_KINDS, Outage
from fairq.runtime.periodic import Periodic
from fairq.runtime.read_back import read_back
from fairq.runtime.registry import WorkerRegistry
from fairq.runtime.settings import StoreFactory, WorkerSettings, WorkerStores
from fairq.runtime.signals import SignalRelay
from fairq.runtime.slots import Slots, TaskHandler
from fairq.runtime.startup_checks import log_default_cap
from fairq.runtime.state import Shared, WorkerStats, log
from fairq.store import Store
from fairq.store.errors import DatabaseError, InsufficientPrivilege, PoolTimeout, error_kind
from fairq.store.listen import channel_for

GATHER_SECONDS = 0.002  # see Worker._gather
# Claim ahead only while handlers average under this: there a claim's round trip is a good part
# of a job's time; behind a longer job, a job claimed ahead would wait longer than the trip saves.
SHORT_JOB_SECONDS = 0.05


class Worker:
    """Runs tasks; built by ``App.worker``. ``run()`` blocks until stopped (or drained).

    Wake-ups and serverless databases: a busy worker claims as slots free up; an
    idle one sleeps until a NOTIFY for one of its queues or its ``poll_interval``, and runs its
    maintenance (reaper, wakers, pruner) only on those polls, so it never queries the database
    more often than ``poll_interval``. A long interval lets a serverless database sleep, at the
    price of delayed jobs and expired leases being noticed later; ``run(until_empty=True)``
    drains and exits instead, for scheduled or request-triggered workers.

    Finishes are written by a finisher thread on its own connection, without waiting for the
    WAL flush (``durable_finishes=True`` waits): see ``WorkerStores.finish``.

    It receives what it needs, never the app: ``stores`` opens its connections, ``tasks`` maps
    task names to handlers, ``settings`` holds the options (checked), ``periodics`` the
    schedules its maintenance enqueues.
    """

    slots_class: ClassVar[type[Slots]] = Slots  # a benchmark swaps in its own

    def __init__(self, stores: StoreFactory, tasks: Mapping[str, TaskHandler],
                 settings: WorkerSettings | None = None, *,
                 periodics: Mapping[tuple[str, str], Periodic] | None = None) -> None:
        self.settings = settings = settings or WorkerSettings()
        self.stores = stores
        self.tasks = tasks
        self.periodics = periodics or {}
        self.concurrency = settings.concurrency
        self.queues = (list(settings.queues) if settings.queues
                       else sorted({t.queue for t in tasks.values()}) or ["default"])
        self.policy = settings.claim_policy
        self.batch = settings.max_batch
        self.ahead = settings.ahead
        self.listen = settings.listen
        self.grace_period = settings.grace_period
        self.observer: WorkerObserver = settings.observer or NullObserver()
        self.worker_id = (settings.worker_id
                          or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}")
        self.application_name = f"fairq-worker {self.worker_id}"[:63]
        self.ready = threading.Event()  # set once the loop runs (and LISTEN is in effect)

        self.connections = WorkerStores(stores, self.application_name, concurrency=self.concurrency,
                                        durable_finishes=settings.durable_finishes,
                                        on_lost=lambda: self.finisher.lost_connection(None))
        self.shared = Shared()
        self.shared.outage = Outage(log, on_reconnect=lambda: observe_reconnect(self.observer),
                                    grace=settings.reap_grace)
        self.stats: WorkerStats = self.shared.stats
        self.heartbeats = Heartbeats(self.shared, lambda: self.connections.heartbeat,
                                     settings.heartbeat_interval)
        self.slots = self.slots_class(tasks, self.shared, self.concurrency,
                                      self.heartbeats.every, FailureLog())
        self.finisher = Finisher(self.shared, lambda: self.connections.finish, self.observer,
                                 durable=settings.durable_finishes,
                                 max_backoff=settings.max_backoff)
        self.drain = Drain(self.shared, self.slots, self.finisher, self.heartbeats,
                           self.observer, self.worker_id, settings.reap_grace)
        # Its row in the worker registry, on the heartbeat thread's connection.
        self.registry = WorkerRegistry(lambda: self.connections.heartbeat, self.worker_id,
                                       queues=self.queues, policy=self.policy.name,
                                       beat_seconds=settings.heartbeat_interval)
        self._signals: SignalRelay | None = None
        self._listener: Listener | None = None
        self._rotation = 0
        self._claim_unknown = False  # a claim's commit is unknown: ``read_back`` first

    @property
    def failure_log(self) -> FailureLog:
        """One WARNING per handler failure, rate-limited (the slots log through it)."""
        return self.slots.failure_log

    @failure_log.setter
    def failure_log(self, failure_log: FailureLog) -> None:
        self.slots.failure_log = failure_log

    @property
    def poll_interval(self) -> float:
        """Seconds between polls when no NOTIFY comes (read at each poll: may be changed)."""
        return self.settings.poll_interval

    @poll_interval.setter
    def poll_interval(self, seconds: float) -> None:
        self.settings.poll_interval = seconds

    # -- connections (see WorkerStores) --------------------------------------------------
    @property
    def store(self) -> Store:
        """The worker's own pool, named after the worker in ``pg_stat_activity``."""
        return self.connections.main

    @property
    def finish_store(self) -> Store:
        """The finisher's connection (not durable unless ``durable_finishes``)."""
        return self.connections.finish

    @property
    def heartbeat_store(self) -> Store:
        """The heartbeat thread's own connection."""
        return self.connections.heartbeat

    # -- public ---------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop claiming; in-flight jobs get ``grace_period`` to finish; ``run()`` then returns."""
        self.shared.stopping.set()
        self.shared.wake.set()

    def run(self, until_empty: bool = False) -> None:
        """Work until ``stop()``, SIGTERM/SIGINT, or (``until_empty``) nothing is runnable.

        ``until_empty`` ends the run once nothing of this worker's runs and a claim finds
        nothing, but waits for a due job whose tenant is only out of tokens (a rate limit): it
        becomes claimable by time alone. Delayed jobs, tenants at their cap and paused tenants
        do not keep it running (``fairq.runtime.drain``).
        """
        quiet_pool_logs()
        self.stores.check_schema()
        # A signal while stopping (a second one) exits at once, leaving running jobs to their
        # leases; the relay logs nothing from the handler, so the exit is logged here.
        self._signals = SignalRelay(self._on_signal, exit_if=self.shared.stopping.is_set)
        try:
            with self._signals:
                self._run(until_empty)
        finally:
            st = self.stats
            self.shared.outage.stopping()
            if self._signals.exited:
                log.warning("second signal: exited without waiting for running jobs; their "
                            "leases will expire and be reaped")
            else:
                log.info("worker %s stopped: done=%d retry=%d failed=%d lease_lost=%d "
                         "released=%d abandoned=%d", self.worker_id, st.done, st.retry,
                         st.failed, st.lease_lost, st.released, st.abandoned)

    def _run(self, until_empty: bool) -> None:
        log.info("worker %s: queues=%s policy=%s concurrency=%d", self.worker_id,
                 ",".join(self.queues), self.policy.name, self.concurrency)
        store = self.store
        log_default_cap(store, self.worker_id, self.concurrency)
        schedule = MaintenanceSchedule(store, self._services(store))
        try:
            self._start_threads()
            self._run_loop(store, schedule, until_empty)
            self.drain.graceful(store, self.grace_period)
        finally:
            if not (self._signals is not None and self._signals.exited):
                self._shutdown_threads()

    # -- set-up ---------------------------------------------------------------------------
    def _services(self, store: Store) -> list[Service]:
        s = self.settings
        services: list[Service] = [
            Reaper(store, s.reap_interval, self.observer, ready=self.shared.outage.may_reap,
                   stall=self.shared.outage.stall),
            DueWaker(store, s.wake_interval),
            StrandedWaker(store, s.stranded_interval), ScheduleRepair(store),
            VtimeRebase(store),
            ReturnsSweep(store),
            ScheduleVacuum(store, s.vacuum_interval),
        ]
        if s.prune_after is not None:
            services.append(Pruner(store, s.prune_after, s.prune_interval))
        if s.time_half_life is not None:
            services.append(UsageDecay(store, self.queues, s.time_half_life))
        if self.periodics:
            services.append(PeriodicScheduler(store, self.periodics, observer=self.observer))
        return services

    def _on_signal(self, signum: int) -> None:
        """On the signal relay's thread, not in the handler (see fairq.runtime.signals)."""
        log.info("signal %d: stopping (in-flight jobs get %.0fs); again to exit now",
                 signum, self.grace_period)
        self.stop()

    def _start_threads(self) -> None:
        self.slots.start()
        self.finisher.start()
        self.heartbeats.start()
        self.registry.start()
        if self.listen:
            self._listener = Listener(self.stores.listen_dsn, channel_for(self.stores.schema),
                                      self.queues, self._on_notify,
                                      application_name=f"{self.application_name} listen",
                                      outage=self.shared.outage)
            self._listener.start()

    def _shutdown_threads(self) -> None:
        if self._listener is not None:
            self._listener.stop()
        self.finisher.stop()
        self.heartbeats.stop()
        self.registry.stop()
        self.slots.stop()
        self.connections.close()

    def _on_notify(self, queues: frozenset[str]) -> None:
        sh = self.shared
        with sh.lock:
            if queues:
                sh.hot |= queues
            else:
                sh.poll_now = True
        sh.wake.set()

    # -- the loop -------------------------------------------------------------------------
    def _run_loop(self, store: Store, schedule: MaintenanceSchedule, until_empty: bool) -> None:
        sh = self.shared
        failures = 0
        next_poll = time.monotonic()
        while not sh.stopping.is_set():
            sh.wake.clear()
            self.stats.loops += 1
            now = time.monotonic()
            # Listening before this turn's poll: the poll the listener asked for on connecting
            # is this one (or an earlier one), so once it is done the worker is ready.
            listening = self._listener is None or self._listener.connected.is_set()
            with sh.lock:
                poll = sh.poll_now or now >= next_poll or (until_empty and not sh.inflight)
                if sh.tenant_wake is not None and now >= sh.tenant_wake:
                    poll, sh.tenant_wake = True, None
                sh.poll_now = False
                busy = bool(sh.inflight or sh.hot)
            try:
                self.shared.outage.calling()  # timed: a stall is an outage (decision 019)
                if self._claim_unknown:
                    read_back(store, self.shared, self.worker_id, self.finisher.recent())
                    self._claim_unknown = False
                if (busy or poll) and schedule.run_due():
                    poll = True  # reaped or woken: there may be work now
                claimed = self._claim_round(store, poll)
                if poll:
                    next_poll = time.monotonic() + self.poll_interval
                if until_empty and self.drain.empty(store, self.queues, claimed, poll,
                                                    self._claim_round):
                    log.info("worker %s: nothing runnable and nothing running; done",
                             self.worker_id)
                    return
                failures = 0
                self.shared.outage.ok()
                self.observer.on_loop(True)
            except InsufficientPrivilege as e:
                # Retrying cannot help: the role lacks the worker's grants (docs/roles.md).
                raise InvalidInput(
                    f"the database role may not run a worker ({str(e).strip().splitlines()[0]}); "
                    "connect as a role given the worker's grants (`fairq roles --worker ROLE "
                    "--apply`)") from None
            except (DatabaseError, PoolTimeout) as e:
                failures += 1
                self.observer.on_loop(False)
                self._db_error(store, e, failures, "claiming again")
                with sh.lock:
                    sh.poll_now = True
                continue
            except Exception:  # a bug (ours or an observer's) must not kill the worker either
                failures += 1
                self.observer.on_loop(False)
                delay = min(self.settings.max_backoff, 0.1 * 2 ** min(failures, 12))
                log.exception("worker loop error; retrying in %.2fs", delay)
                sh.stopping.wait(delay)
                continue
            if self.listen and not self.ready.is_set():
                if listening:
                    self.ready.set()
            elif not self.listen:
                self.ready.set()
            self._wait(schedule, next_poll)

    def _wait(self, schedule: MaintenanceSchedule, next_poll: float) -> None:
        sh = self.shared
        with sh.lock:
            free = self._capacity() - len(sh.inflight)
            ready = bool((sh.hot and free > 0) or sh.poll_now)
            deadlines = [next_poll]
            if sh.tenant_wake is not None:
                deadlines.append(sh.tenant_wake)
            if not ready and sh.inflight:
                deadlines.append(schedule.next_due())
        if not ready:
            if self.listen and not self.ready.is_set():
                deadlines.append(time.monotonic() + 0.05)  # until LISTEN is in effect
            sh.wake.wait(max(0.0, min(deadlines) - time.monotonic()))
        self._gather()

    def _gather(self) -> None:
        """While other slots are still busy, give them ``GATHER_SECONDS`` to free up too, so
        that one claim fills several: with short jobs, claiming on every completion would
        cost a round trip per job. A slot idles for at most that long."""
        sh = self.shared
        deadline = time.monotonic() + GATHER_SECONDS
        while True:
            with sh.lock:
                capacity = self._capacity()
                free, want = capacity - len(sh.inflight), min(self.batch, capacity)
                if not sh.inflight or free >= want or sh.poll_now or not sh.hot:
                    return
            left = deadline - time.monotonic()
            if left <= 0 or sh.stopping.is_set():
                return
            sh.wake.clear()
            sh.wake.wait(left)

    def _capacity(self) -> int:
        """The slots, plus the jobs it may claim ahead while handlers are short (caller holds
        the lock)."""
        run = self.shared.run_seconds
        if self.ahead and run is not None and run < SHORT_JOB_SECONDS:
            return self.concurrency + self.ahead
        return self.concurrency

    def _claim_round(self, store: Store, poll: bool) -> int:
        """Claim into the free slots (and ahead of them) from hot queues (all of them on a poll);
        returns how many."""
        sh = self.shared
        with sh.lock:
            free = self._capacity() - len(sh.inflight)
            targets = list(self.queues) if poll else [q for q in self.queues if q in sh.hot]
        if free <= 0 or not targets:
            return 0
        k = self._rotation % len(targets)
        self._rotation += 1
        total = 0
        for q in targets[k:] + targets[:k]:
            while free > 0:  # a full batch means there is probably more: fill the free slots
                want, sent = min(free, self.batch), time.monotonic()
                jobs = self._claim_one(store, q, want)
                if jobs:
                    self.stats.claimed += len(jobs)
                    self.slots.dispatch(store, jobs)
                    self.heartbeats.count_from(jobs, sent)
                    free -= len(jobs)
                    total += len(jobs)
                if len(jobs) < want:
                    break
        return total

    def _db_error(self, store: Store, error: DatabaseError | PoolTimeout, failures: int,
                  next_step: str) -> None:
        """Log (once per outage) and count ``error``, drop dead connections, wait."""
        self.shared.count_db_error()  # the finisher thread counts its errors there too
        r = react(error, failures, self.settings.max_backoff, next_step)
        observe(self.observer, r.kind)
        if r.kind in OUTAGE_KINDS:
            self.shared.outage.lost(error, r.delay)  # one line per outage, not per error
        elif r.unexpected:
            log.exception(r.line)
        else:
            log.warning(r.line)
        if r.drop_connections:
            self.finisher.lost_connection(error)
            with contextlib.suppress(Exception):  # the pool itself is fine; the server may not be
                store.drop_dead_connections()
        self.shared.stopping.wait(r.delay)

    def _claim_one(self, store: Store, q: str, want: int) -> list[ClaimedJob]:
        t0 = time.perf_counter()
        try:
            jobs = store.claim(self.policy, queue=q, batch=want, worker=self.worker_id)
        except (DatabaseError, PoolTimeout) as e:
            # Lost under the statement: it may have committed (a pool timeout never sent it).
            if error_kind(e) in ("admin_shutdown", "connection_lost"):
                self._claim_unknown = True
            self.observer.on_claim(q, self.policy.name, "error", time.perf_counter() - t0, [])
            raise
        try:  # the jobs are ours now: an observer's error must not strand them
            self.observer.on_claim(q, self.policy.name, "claimed" if jobs else "empty",
                                   time.perf_counter() - t0, jobs)
        except Exception:
            log.exception("observer error in on_claim (the claimed jobs run anyway)")
        with self.shared.lock:
            if len(jobs) >= want:
                self.shared.hot.add(q)
            else:
                self.shared.hot.discard(q)
        if len(jobs) < want:
            self._note_next_wake(store, q)
        return jobs

    def _note_next_wake(self, store: Store, q: str) -> None:
        """Remember when the queue's first idle tenant wakes (at least 10 ms from now, so a
        sleeper another claim holds does not make this loop spin)."""
        seconds = store.next_wake(q)
        if seconds is not None:
            self.shared.wake_tenants_at(time.monotonic() + max(MIN_WAKE_SECONDS, seconds))
