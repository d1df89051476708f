"""The worker runtime: claim under a policy, run handlers in slots, finish with fencing.

One control thread (the caller of ``run()``) claims no more jobs than there are free slots,
heartbeats leases and runs maintenance. A finisher thread writes completed jobs in batches on
its own connection, so a finish overlaps the next claim instead of delaying it: with short
jobs the loop's round trips are then claims only. Handlers run outside any transaction:
sync ones on slot threads, ``async def`` ones on one event-loop thread. A crash between a
handler's return and its batched finish only makes the job run again after its lease
expires, never lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue as queue_mod
import random
import secrets
import socket
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import psycopg
from psycopg_pool import PoolTimeout

from fairq import validation as v
from fairq.errors import InvalidInput
from fairq.failure_log import FailureLog
from fairq.job import Job
from fairq.listener import Listener
from fairq.maintenance import (
    DEFAULT_VACUUM_INTERVAL,
    DueWaker,
    MaintenanceSchedule,
    PeriodicScheduler,
    Pruner,
    Reaper,
    ScheduleVacuum,
    Service,
    StrandedWaker,
    VtimeRebase,
)
from fairq.models import ClaimedJob, UndecodablePayload
from fairq.observe import NullObserver, WorkerObserver
from fairq.policies import get_policy
from fairq.results import encode_result
from fairq.signals import SignalRelay
from fairq.store import Store
from fairq.store.pg import channel_for

if TYPE_CHECKING:
    from fairq.app import App

log = logging.getLogger("fairq.worker")

MAX_ERROR_CHARS = 4000
DEFAULT_MAX_BATCH = 10  # up to 10 a round trip by default
# Finishes commit without waiting for the WAL flush (see Worker.finish_store). PostgreSQL
# flushes such commits within 3 x wal_writer_delay (600 ms by default); after a lost connection
# the worker writes the finishes of this many seconds again (fenced, so a no-op where they
# survived), so a crash of the database re-runs almost none of them.
FINISH_REPLAY_SECONDS = 10.0
REPLAY_CHUNK = 5000  # finishes per statement when they are written again
GATHER_SECONDS = 0.002  # see Worker._gather
MAX_CONCURRENCY = 1024  # slots are threads: beyond this the process runs out of them
MAX_SECONDS = 10 * 365 * 86400.0  # any interval, grace or age a worker takes (ten years)


def _seconds(value: object, low: float, *, exclusive: bool = False) -> bool:
    """Whether ``value`` is a number of seconds from ``low`` (excluded if ``exclusive``) up to
    MAX_SECONDS: ``inf`` and ``nan`` would make the loop's waits and dates fail later."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return (value > low if exclusive else value >= low) and value <= MAX_SECONDS


def describe_error(exc: BaseException) -> str:
    """``last_error`` text: type, message and the innermost few frames of the traceback."""
    try:
        message = str(exc)
    except Exception:  # an unprintable exception must still fail its job, not kill the slot
        message = "<str() of the exception failed>"
    head = f"{type(exc).__qualname__}: {message}"
    try:
        frames = "".join(traceback.format_tb(exc.__traceback__, limit=-5))
    except Exception:
        frames = ""
    text = f"{head}\n{frames}".rstrip()
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


@dataclass
class _Running:
    job: Job
    started: float  # monotonic, when handed to a slot
    next_extend: float


@dataclass
class _Completion:
    job: Job
    error: str | None
    run_seconds: float
    retry_delay: float | None = None
    result: str | None = None  # the handler's return value as JSON (fairq.results)
    note: str | None = None    # why it was not stored
    final: bool = False  # fail for good: a retry could only fail the same way


@dataclass
class WorkerStats:
    """Counts since start-up, for logs and tests (metrics go through the observer).

    The control thread alone writes claimed, loops, released and abandoned; the outcome
    counters and db_errors, written by the finisher and the control thread (which also finishes
    while it drains), are changed under the worker's lock.
    """

    claimed: int = 0
    done: int = 0
    retry: int = 0
    failed: int = 0
    lease_lost: int = 0
    released: int = 0
    abandoned: int = 0
    db_errors: int = 0
    loops: int = 0
    by_outcome: dict[str, int] = field(default_factory=dict)


class Worker:
    """Runs an app's tasks; see ``App.worker``. ``run()`` blocks until stopped (or drained).

    Wake-ups and serverless databases: a busy worker claims as slots free up; an
    idle one sleeps until a NOTIFY for one of its queues or its ``poll_interval``, and runs its
    maintenance (reaper, wakers, pruner) only on those polls, so it never queries the database
    more often than ``poll_interval``. A long interval lets a serverless database sleep, at the
    price of delayed jobs and expired leases being noticed later; ``run(until_empty=True)``
    drains and exits instead, for scheduled or request-triggered workers.

    Finishes are written by a finisher thread on its own connection, without waiting for the
    WAL flush (``durable_finishes=True`` waits): see ``finish_store``.
    """

    def __init__(
        self,
        app: App,
        *,
        concurrency: int = 8,
        queues: Sequence[str] | None = None,
        policy: str = "weighted",
        batch: int | None = None,
        poll_interval: float = 5.0,
        listen: bool = True,
        heartbeat_interval: float | None = None,
        reap_interval: float = 5.0,
        wake_interval: float = 1.0,
        stranded_interval: float = 30.0,
        vacuum_interval: float = DEFAULT_VACUUM_INTERVAL,
        prune_after: float | None = None,
        prune_interval: float = 60.0,
        grace_period: float = 30.0,
        observer: WorkerObserver | None = None,
        worker_id: str | None = None,
        max_backoff: float = 30.0,
        durable_finishes: bool = False,
    ) -> None:
        if (isinstance(concurrency, bool) or not isinstance(concurrency, int)
                or not 1 <= concurrency <= MAX_CONCURRENCY):
            raise InvalidInput(f"concurrency must be an integer from 1 to {MAX_CONCURRENCY} "
                               f"(one thread each), not {concurrency!r}")
        if batch is not None and (not isinstance(batch, int) or batch < 1):
            raise InvalidInput(f"batch must be an integer >= 1, not {batch!r}")
        for label, value in (("poll_interval", poll_interval), ("reap_interval", reap_interval),
                             ("wake_interval", wake_interval),
                             ("stranded_interval", stranded_interval),
                             ("vacuum_interval", vacuum_interval),
                             ("prune_interval", prune_interval), ("max_backoff", max_backoff)):
            if not _seconds(value, 0, exclusive=True):
                raise InvalidInput(f"{label} must be a number of seconds > 0 and at most "
                                   f"{MAX_SECONDS:g}, not {value!r}")
        if heartbeat_interval is not None and not _seconds(heartbeat_interval, 0, exclusive=True):
            raise InvalidInput(f"heartbeat_interval must be > 0 and at most {MAX_SECONDS:g} "
                               f"seconds, not {heartbeat_interval!r}")
        if not _seconds(grace_period, 0):
            raise InvalidInput(f"grace_period must be >= 0 and at most {MAX_SECONDS:g} seconds, "
                               f"not {grace_period!r}")
        if prune_after is not None and not _seconds(prune_after, 0):
            raise InvalidInput(f"prune_after must be >= 0 and at most {MAX_SECONDS:g} seconds, "
                               f"not {prune_after!r}")
        if isinstance(queues, str):
            raise InvalidInput(f"queues must be a list of queue names, not the string {queues!r}")
        if queues is not None:
            queues = [v.name("queue", q) for q in queues]
        self.app = app
        self.concurrency = concurrency
        if queues:
            self.queues = list(dict.fromkeys(queues))
        else:
            self.queues = sorted({t.queue for t in app.tasks.values()}) or ["default"]
        self.policy = get_policy(policy)
        self.batch = batch or DEFAULT_MAX_BATCH
        self.poll_interval = poll_interval
        self.listen = listen
        self.heartbeat_interval = heartbeat_interval
        self.grace_period = grace_period
        self.observer: WorkerObserver = observer or NullObserver()
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.application_name = f"fairq-worker {self.worker_id}"[:63]
        self.max_backoff = max_backoff
        self.durable_finishes = durable_finishes
        self.stats = WorkerStats()
        self.ready = threading.Event()  # set once the loop runs (and LISTEN is in effect)
        self.failure_log = FailureLog()  # one WARNING per handler failure, rate-limited

        self._intervals = (reap_interval, wake_interval, stranded_interval)
        self._vacuum_interval = vacuum_interval
        self._prune = (prune_after, prune_interval)
        self._store: Store | None = None
        self._finish_store: Store | None = None
        self._heartbeat_store: Store | None = None
        self._heartbeater: threading.Thread | None = None
        self._heartbeat_wake = threading.Event()
        self._heartbeat_exit = threading.Event()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._signals: SignalRelay | None = None
        self._hot: set[str] = set()
        self._poll_now = True
        # When the first idle tenant of a queue whose claim came back short is due to wake (a
        # delayed job, a rate-limited tenant's next token): a poll then, not at poll_interval.
        self._tenant_wake: float | None = None
        self._inflight: dict[tuple[int, int], _Running] = {}
        # Jobs whose handler returned and whose finish is not written yet (a held lock may delay
        # it for a while): the heartbeat thread keeps their leases too.
        self._unwritten: dict[tuple[int, int], _Running] = {}
        self._completions: list[_Completion] = []
        self._finishing = 0  # completions taken by a finish that has not returned yet
        self._stuck: set[tuple[str, str]] = set()  # (queue, tenant) whose row another tx holds
        self._finish_wake = threading.Event()
        self._finisher: threading.Thread | None = None
        self._finisher_exit = threading.Event()
        self._recent_finishes: deque[tuple[float, list[_Completion]]] = deque()
        self._replay_finishes = threading.Event()
        self._pending: queue_mod.SimpleQueue[Job | None] = queue_mod.SimpleQueue()
        self._slots: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._listener: Listener | None = None
        self._rotation = 0

    # -- public ---------------------------------------------------------------------------
    @property
    def store(self) -> Store:
        """The worker's own pool, named after the worker in ``pg_stat_activity``."""
        if self._store is None:
            self._store = Store(
                self.app.dsn, self.app.schema, min_size=1, max_size=2 + min(self.concurrency, 4),
                application_name=self.application_name, timeout=5.0,
                prepare_threshold=getattr(self.app, "_prepare_threshold", 5),
                pooler=self.app.pooler,
            )
        return self._store

    @property
    def finish_store(self) -> Store:
        """The finisher's connection: commits without waiting for the WAL flush, unless
        ``durable_finishes``. A database crash may then undo the last finishes of a fraction of
        a second; those jobs are still running under their leases, so the reaper runs them again:
        a re-run, as after a worker crash, never a lost job. Their tenants' slots come back with
        them (same transaction). Claims, enqueues and reaps stay durable."""
        if self._finish_store is None:
            self._finish_store = Store(
                self.app.dsn, self.app.schema, min_size=1, max_size=1,
                application_name=self.application_name, timeout=5.0,
                prepare_threshold=getattr(self.app, "_prepare_threshold", 5),
                pooler=self.app.pooler, durable_commits=self.durable_finishes,
            )
        return self._finish_store

    @property
    def heartbeat_store(self) -> Store:
        """The heartbeat thread's own connection: a claim waiting for a lock, or any slow
        statement of the control thread, cannot delay the leases of running jobs."""
        if self._heartbeat_store is None:
            self._heartbeat_store = Store(
                self.app.dsn, self.app.schema, min_size=1, max_size=1,
                application_name=self.application_name, timeout=5.0,
                prepare_threshold=getattr(self.app, "_prepare_threshold", 5),
                pooler=self.app.pooler,
            )
        return self._heartbeat_store

    def stop(self) -> None:
        """Stop claiming; in-flight jobs get ``grace_period`` to finish; ``run()`` then returns."""
        self._stopping.set()
        self._wake.set()

    def run(self, until_empty: bool = False) -> None:
        """Work until ``stop()``, SIGTERM/SIGINT, or (``until_empty``) nothing is runnable."""
        self._check_schema()
        # A signal while stopping (a second one) exits at once, leaving running jobs to their
        # leases; the relay logs nothing from the handler, so the exit is logged here.
        self._signals = SignalRelay(self._on_signal, exit_if=self._stopping.is_set)
        try:
            with self._signals:
                self._run(until_empty)
        finally:
            st = self.stats
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
        schedule = MaintenanceSchedule(store, self._services(store))
        try:
            self._start_threads()
            self._run_loop(store, schedule, until_empty)
            self._drain(store)
        finally:
            if not (self._signals is not None and self._signals.exited):
                self._shutdown_threads()

    # -- set-up ---------------------------------------------------------------------------
    def _check_schema(self) -> None:
        """Refuse an unmigrated or outdated schema at once, with what to do, rather than
        retrying its statements' errors forever (``ConfigurationError``)."""
        from fairq import migrate

        try:
            migrate.require_current(self.app.dsn, self.app.schema)
        except psycopg.errors.InsufficientPrivilege:
            log.warning("cannot read %s.alembic_version to check the schema's revision (grant "
                        "it with `fairq roles --apply`); starting unchecked", self.app.schema)
        except psycopg.OperationalError as e:  # the database is away: the loop waits for it
            log.warning("could not check the schema's migrations (%s); starting anyway",
                        str(e).strip()[:200])

    def _services(self, store: Store) -> list[Service]:
        reap, wake, stranded = self._intervals
        services: list[Service] = [
            Reaper(store, reap, self.observer),
            DueWaker(store, wake),
            StrandedWaker(store, stranded),
            VtimeRebase(store),
            ScheduleVacuum(store, self._vacuum_interval),
        ]
        max_age, prune_interval = self._prune
        if max_age is not None:
            services.append(Pruner(store, max_age, prune_interval))
        if getattr(self.app, "periodics", None):
            services.append(PeriodicScheduler(store, self.app.periodics, observer=self.observer))
        return services

    def _on_signal(self, signum: int) -> None:
        """On the signal relay's thread, not in the handler (see fairq.signals)."""
        log.info("signal %d: stopping (in-flight jobs get %.0fs); again to exit now",
                 signum, self.grace_period)
        self.stop()

    def _start_threads(self) -> None:
        for i in range(self.concurrency):
            t = threading.Thread(target=self._slot, name=f"fairq-slot-{i}", daemon=True)
            t.start()
            self._slots.append(t)
        self._finisher = threading.Thread(target=self._finish_loop, name="fairq-finisher",
                                          daemon=True)
        self._finisher.start()
        self._heartbeater = threading.Thread(target=self._heartbeat_loop, name="fairq-heartbeat",
                                             daemon=True)
        self._heartbeater.start()
        if any(t.is_async for t in self.app.tasks.values()):
            self._async_loop()
        if self.listen:
            self._listener = Listener(self.app.listen_dsn, channel_for(self.app.schema),
                                      self.queues, self._on_notify,
                                      application_name=f"{self.application_name} listen")
            self._listener.start()

    def _async_loop(self) -> asyncio.AbstractEventLoop:
        """The event loop for ``async def`` handlers, started on first need."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._loop_thread = threading.Thread(target=self._loop.run_forever,
                                                 name="fairq-async", daemon=True)
            self._loop_thread.start()
        return self._loop

    def _shutdown_threads(self) -> None:
        if self._listener is not None:
            self._listener.stop()
        if self._finisher is not None:
            self._finisher_exit.set()
            self._finish_wake.set()
            self._finisher.join(timeout=5.0)
            self._finisher = None
        if self._heartbeater is not None:
            self._heartbeat_exit.set()
            self._heartbeat_wake.set()
            self._heartbeater.join(timeout=5.0)
            self._heartbeater = None
        for _ in self._slots:
            self._pending.put(None)
        for t in self._slots:
            t.join(timeout=1.0)
        self._slots.clear()
        if self._loop is not None and self._loop_thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop_thread.join(timeout=1.0)
            if not self._loop_thread.is_alive():
                self._loop.close()
            self._loop = None
        if self._store is not None:
            self._store.close()
            self._store = None
        if self._finish_store is not None:
            self._finish_store.close()
            self._finish_store = None
        if self._heartbeat_store is not None:
            self._heartbeat_store.close()
            self._heartbeat_store = None

    def _on_notify(self, queues: frozenset[str]) -> None:
        with self._lock:
            if queues:
                self._hot |= queues
            else:
                self._poll_now = True
        self._wake.set()

    # -- slots ----------------------------------------------------------------------------
    def _slot(self) -> None:
        while True:
            job = self._pending.get()
            if job is None:
                return
            self._execute(job)

    def _execute(self, job: Job) -> None:
        task = self.app.tasks[job.task]
        t0 = time.monotonic()
        error: str | None = None
        value = None
        try:
            value = task.fn(job)
        except BaseException as e:  # KeyboardInterrupt/SystemExit in a handler fail the job only
            error = describe_error(e)
        self._complete(job, error, time.monotonic() - t0, result=encode_result(value))

    async def _execute_async(self, job: Job) -> None:
        task = self.app.tasks[job.task]
        t0 = time.monotonic()
        error: str | None = None
        value = None
        try:
            value = await task.fn(job)
        except BaseException as e:
            error = describe_error(e)
        self._complete(job, error, time.monotonic() - t0, result=encode_result(value))

    def _complete(self, job: Job, error: str | None, seconds: float,
                  retry_delay: float | None = None,
                  result: tuple[str | None, str | None] = (None, None),
                  final: bool = False) -> None:
        with self._lock:
            running = self._inflight.pop((job.id, job.attempt), None)
            if running is None:
                return  # abandoned after the grace period: already handed back
            self._unwritten[(job.id, job.attempt)] = running
            self._completions.append(_Completion(job, error, seconds, retry_delay, *result,
                                                 final=final))
        if error is not None:
            self.failure_log.failed(job, error)
        self._finish_wake.set()
        self._wake.set()  # a slot is free

    def _dispatch(self, store: Store, claimed: Sequence[ClaimedJob]) -> None:
        now = time.monotonic()
        for c in claimed:
            job = Job.from_claim(c, store)
            with self._lock:
                self._inflight[(job.id, job.attempt)] = _Running(
                    job, now, now + self._heartbeat_every(job))
            try:
                self._hand_over(job)
            except Exception as e:  # this job fails; the rest of the batch runs
                self._complete(job, f"could not start the job: {describe_error(e)}", 0.0)
        self._heartbeat_wake.set()  # new leases to keep

    def _hand_over(self, job: Job) -> None:
        """Give a claimed (and in-flight) job to its handler, or fail it when it cannot run."""
        if isinstance(job.payload, UndecodablePayload):
            self._complete(job, f"payload cannot be decoded ({job.payload.undecodable_payload}); "
                           "failed without retries", 0.0, final=True)
            return
        task = self.app.tasks.get(job.task)
        if task is None:
            known = ", ".join(sorted(self.app.tasks)) or "nothing"
            self._complete(job, f"unknown task {job.task!r}: this worker knows {known}", 0.0)
        elif task.is_async:
            asyncio.run_coroutine_threadsafe(self._execute_async(job), self._async_loop())
        else:
            self._pending.put(job)

    def _heartbeat_every(self, job: Job) -> float:
        return self.heartbeat_interval or max(0.1, job.lease_seconds / 3.0)

    # -- the loop -------------------------------------------------------------------------
    def _run_loop(self, store: Store, schedule: MaintenanceSchedule, until_empty: bool) -> None:
        failures = 0
        next_poll = time.monotonic()
        while not self._stopping.is_set():
            self._wake.clear()
            self.stats.loops += 1
            now = time.monotonic()
            # Listening before this turn's poll: the poll the listener asked for on connecting
            # is this one (or an earlier one), so once it is done the worker is ready.
            listening = self._listener is None or self._listener.connected.is_set()
            with self._lock:
                poll = self._poll_now or now >= next_poll or (until_empty and not self._inflight)
                if self._tenant_wake is not None and now >= self._tenant_wake:
                    poll, self._tenant_wake = True, None
                self._poll_now = False
                busy = bool(self._inflight or self._hot)
            try:
                if (busy or poll) and schedule.run_due():
                    poll = True  # reaped or woken: there may be work now
                claimed = self._claim_round(store, poll)
                if poll:
                    next_poll = time.monotonic() + self.poll_interval
                if until_empty and self._drained(store, claimed, poll):
                    log.info("worker %s: nothing runnable and nothing running; done",
                             self.worker_id)
                    return
                failures = 0
                self.observer.on_loop(True)
            except psycopg.errors.InsufficientPrivilege as e:
                # Retrying cannot help: the role lacks the worker's grants (docs/roles.md).
                raise InvalidInput(
                    f"the database role may not run a worker ({str(e).strip().splitlines()[0]}); "
                    "connect as a role given the worker's grants (`fairq roles --worker ROLE "
                    "--apply`)") from None
            except (psycopg.Error, PoolTimeout) as e:
                failures += 1
                with self._lock:  # the finisher thread counts its errors here too
                    self.stats.db_errors += 1
                self.observer.on_loop(False)
                delay = min(self.max_backoff, 0.1 * 2 ** min(failures, 12))
                delay *= random.uniform(0.5, 1.0)
                if isinstance(e, psycopg.errors.LockNotAvailable):
                    log.warning("lock timeout: a statement waited longer than lock_timeout for "
                                "a lock another session holds (%s); retrying in %.2fs",
                                str(e).strip()[:200], delay)
                elif isinstance(e, psycopg.errors.QueryCanceled):
                    log.warning("statement timeout: a statement ran longer than "
                                "statement_timeout (%s); retrying in %.2fs",
                                str(e).strip()[:200], delay)
                elif isinstance(e, psycopg.OperationalError | PoolTimeout):
                    log.warning("database unavailable (%s: %s); retrying in %.2fs",
                                type(e).__name__, str(e).strip()[:200], delay)
                    self._lost_connection(e)
                else:
                    log.exception("database error; retrying in %.2fs", delay)
                with self._lock:
                    self._poll_now = True
                self._stopping.wait(delay)
                continue
            except Exception:  # a bug (ours or an observer's) must not kill the worker either
                failures += 1
                self.observer.on_loop(False)
                delay = min(self.max_backoff, 0.1 * 2 ** min(failures, 12))
                log.exception("worker loop error; retrying in %.2fs", delay)
                self._stopping.wait(delay)
                continue
            if self.listen and not self.ready.is_set():
                if listening:
                    self.ready.set()
            elif not self.listen:
                self.ready.set()
            self._wait(schedule, next_poll)

    def _wait(self, schedule: MaintenanceSchedule, next_poll: float) -> None:
        with self._lock:
            free = self.concurrency - len(self._inflight)
            ready = bool((self._hot and free > 0) or self._poll_now)
            deadlines = [next_poll]
            if self._tenant_wake is not None:
                deadlines.append(self._tenant_wake)
            if not ready and self._inflight:
                deadlines.append(schedule.next_due())
        if not ready:
            if self.listen and not self.ready.is_set():
                deadlines.append(time.monotonic() + 0.05)  # until LISTEN is in effect
            self._wake.wait(max(0.0, min(deadlines) - time.monotonic()))
        self._gather()

    def _gather(self) -> None:
        """While other slots are still busy, give them ``GATHER_SECONDS`` to free up too, so
        that one claim fills several: with short jobs, claiming on every completion would
        cost a round trip per job. A slot idles for at most that long."""
        deadline = time.monotonic() + GATHER_SECONDS
        want = min(self.batch, self.concurrency)
        while True:
            with self._lock:
                free = self.concurrency - len(self._inflight)
                if not self._inflight or free >= want or self._poll_now or not self._hot:
                    return
            left = deadline - time.monotonic()
            if left <= 0 or self._stopping.is_set():
                return
            self._wake.clear()
            self._wake.wait(left)

    def _claim_round(self, store: Store, poll: bool) -> int:
        """Claim into the free slots from hot queues (all of them on a poll); returns how many."""
        with self._lock:
            free = self.concurrency - len(self._inflight)
            targets = list(self.queues) if poll else [q for q in self.queues if q in self._hot]
        if free <= 0 or not targets:
            return 0
        k = self._rotation % len(targets)
        self._rotation += 1
        total = 0
        for q in targets[k:] + targets[:k]:
            while free > 0:  # a full batch means there is probably more: fill the free slots
                want = min(free, self.batch)
                jobs = self._claim_one(store, q, want)
                if jobs:
                    self.stats.claimed += len(jobs)
                    self._dispatch(store, jobs)
                    free -= len(jobs)
                    total += len(jobs)
                if len(jobs) < want:
                    break
        return total

    def _claim_one(self, store: Store, q: str, want: int) -> list[ClaimedJob]:
        t0 = time.perf_counter()
        try:
            jobs = store.claim(self.policy, queue=q, batch=want, worker=self.worker_id)
        except (psycopg.Error, PoolTimeout):
            self.observer.on_claim(q, self.policy.name, "error", time.perf_counter() - t0, [])
            raise
        try:  # the jobs are ours now: an observer's error must not strand them
            self.observer.on_claim(q, self.policy.name, "claimed" if jobs else "empty",
                                   time.perf_counter() - t0, jobs)
        except Exception:
            log.exception("observer error in on_claim (the claimed jobs run anyway)")
        with self._lock:
            if len(jobs) >= want:
                self._hot.add(q)
            else:
                self._hot.discard(q)
        if len(jobs) < want:
            self._note_next_wake(store, q)
        return jobs

    def _note_next_wake(self, store: Store, q: str) -> None:
        """Remember when the queue's first idle tenant wakes (at least 10 ms from now, so a
        sleeper another claim holds does not make this loop spin)."""
        seconds = store.next_wake(q)
        if seconds is None:
            return
        at = time.monotonic() + max(0.01, seconds)
        with self._lock:
            if self._tenant_wake is None or at < self._tenant_wake:
                self._tenant_wake = at

    def _drained(self, store: Store, claimed: int, poll: bool) -> bool:
        """Done when nothing runs here and a claim found nothing: a fair claim comes back empty
        only when no tenant it could lock has a due job under its cap (docs/algorithm.md).

        Expired leases are returned first, so a drain does not end with a dead worker's jobs
        still ``running``; a job they hand back is claimed like any other.
        """
        with self._lock:
            if claimed or not poll or self._inflight or self._completions or self._finishing:
                return False
        reaped = store.reap_expired()
        for queue in sorted(set(reaped.requeued) | set(reaped.failed)):
            self.observer.on_reap(queue, reaped.requeued.get(queue, 0) + reaped.failed.get(queue, 0))
        if reaped.total:
            return False
        if self._claim_round(store, True):
            return False
        if store.runnable_exists(self.queues):
            log.info("worker %s: due jobs remain but none may be claimed: their tenants are at "
                     "their caps or paused", self.worker_id)
        return True

    def _finish_loop(self) -> None:
        """The finisher thread: write completions as they come, until the threads shut down.

        The graceful-stop path may finish on the control thread too: each call takes its own
        completions under the lock, and finishes are fenced, so the two never write one twice.
        """
        store = self.finish_store
        failures = 0
        while not self._finisher_exit.is_set():
            self._finish_wake.wait()
            self._finish_wake.clear()
            try:
                if self._replay_finishes.is_set():
                    self._replay(store)
                self._finish_completions(store)
                failures = 0
            except (psycopg.Error, PoolTimeout) as e:
                self._lost_connection(e)
                failures += 1
                with self._lock:  # the control thread counts its errors here too
                    self.stats.db_errors += 1
                delay = min(self.max_backoff, 0.1 * 2 ** min(failures, 12)) * random.uniform(0.5, 1)
                log.warning("finishing jobs failed (%s: %s); retrying in %.2fs",
                            type(e).__name__, str(e).strip()[:200], delay)
                self._finish_wake.set()
                self._finisher_exit.wait(delay)
            except Exception:  # a bug (ours or an observer's) must not stop finishing
                log.exception("finisher error; retrying in 1s")
                self._finish_wake.set()
                self._finisher_exit.wait(1.0)

    def _lost_connection(self, error: Exception) -> None:
        """If ``error`` says the connection or the server went away, the database may have
        crashed, undoing recent finishes it had not flushed: have them written again. (Lock and
        statement timeouts, or SQL errors, leave the server up and say nothing of the kind.)"""
        if self.durable_finishes:
            return
        state = getattr(error, "sqlstate", None)
        if isinstance(error, PoolTimeout) or (
                isinstance(error, psycopg.OperationalError)
                and (state is None or state.startswith(("08", "57P")))):
            self._replay_finishes.set()
            self._finish_wake.set()

    def _forget_old_finishes(self, now: float) -> None:
        """Drop remembered finishes older than FINISH_REPLAY_SECONDS (caller holds the lock)."""
        while self._recent_finishes and self._recent_finishes[0][0] < now - FINISH_REPLAY_SECONDS:
            self._recent_finishes.popleft()

    def _replay(self, store: Store) -> None:
        """Write the recent finishes again, fenced: only those a crash undid change anything."""
        with self._lock:
            self._forget_old_finishes(time.monotonic())
            recent = [c for _, batch in self._recent_finishes for c in batch]
        self._replay_finishes.clear()
        repaired = 0
        try:
            for i in range(0, len(recent), REPLAY_CHUNK):
                chunk = recent[i:i + REPLAY_CHUNK]
                done = [c for c in chunk if c.error is None]
                repaired += len(store.finish_done([(c.job.id, c.job.attempt) for c in done],
                                                  [c.result for c in done],
                                                  [c.note for c in done]))
                repaired += len(store.finish_failed([
                    (c.job.id, c.job.attempt, c.error, c.retry_delay)
                    for c in chunk if c.error is not None], [c.job.id for c in chunk if c.final]))
        except BaseException:
            self._replay_finishes.set()
            raise
        if repaired:
            log.warning("wrote %d finish(es) again that the database had lost (a crash before "
                        "their commit was flushed)", repaired)

    def _finish_completions(self, store: Store) -> None:
        with self._lock:
            batch, self._completions = self._completions, []
            taken = len(batch)
            self._finishing += taken
        if not batch:
            return
        try:
            self._write(store, batch)
        except BaseException:
            with self._lock:  # not written: keep them for the next try (fenced, so idempotent)
                self._completions[:0] = batch
            raise
        finally:
            with self._lock:
                self._finishing -= taken
            # After the count: a drain waiting for it to reach 0 must see it when it wakes.
            self._wake.set()

    def _write(self, store: Store, batch: list[_Completion]) -> None:
        """Finish ``batch``, taking out of it what was written; raise if anything is left.

        A finish locks its tenants' schedule rows to give their slots back. An application
        transaction that enqueued for an idle tenant holds that row until it commits (and a
        handler that leaked a transaction may hold its own job's row), and the batch's statement
        would wait for it and fail after ``lock_timeout``, with every other tenant's finishes in
        it. So a batch that meets a held row is finished tenant by tenant:
        only the held tenant's completions wait. Its tenant is remembered as stuck, finished on
        its own from then on (the others never wait for it again) until its finish goes
        through, and the leases of its waiting jobs are extended meanwhile, so that the reaper
        does not run them again.
        """
        with self._lock:
            stuck = set(self._stuck)
        ready = [c for c in batch if (c.job.queue, c.job.tenant) not in stuck]
        error: psycopg.errors.LockNotAvailable | None = None
        held: set[tuple[str, str]] = set()  # a tenant the batch's statement just waited for
        if ready:
            try:
                self._finish(store, ready, batch)
            except psycopg.errors.LockNotAvailable as e:
                error = e
                tenants = {(c.job.queue, c.job.tenant) for c in ready}
                if len(tenants) == 1:
                    held = tenants
        if not batch:
            return
        groups: dict[tuple[str, str], list[_Completion]] = {}
        for c in batch:
            groups.setdefault((c.job.queue, c.job.tenant), []).append(c)
        for key, group in groups.items():
            if key not in held:
                try:
                    self._finish(store, group, batch)
                except psycopg.errors.LockNotAvailable as e:
                    error = e
                else:
                    with self._lock:
                        self._stuck.discard(key)
                    continue
            with self._lock:
                new = key not in self._stuck
                self._stuck.add(key)
            if new:
                log.warning("finishes of tenant %r (queue %r) wait: another transaction holds a "
                            "row they lock (its schedule row, or a job's); finishing the other "
                            "tenants' jobs meanwhile", key[1], key[0])
            # If the held row is a job's own, its lease cannot be extended either.
            with contextlib.suppress(psycopg.errors.LockNotAvailable):
                store.extend_leases([(c.job.id, c.job.attempt) for c in group])
        if error is not None:
            raise error

    def _finish(self, store: Store, part: list[_Completion], batch: list[_Completion]) -> None:
        """Finish ``part`` of ``batch``: done jobs, then failed ones, each statement's jobs
        taken out of ``batch`` (in place) once it committed, so a retry never writes them again.
        """
        done = [c for c in part if c.error is None]
        failed = [c for c in part if c.error is not None]
        if done:
            ok = {f.id for f in store.finish_done([(c.job.id, c.job.attempt) for c in done],
                                                  [c.result for c in done], [c.note for c in done])}
            self._finished(batch, {(c.job.id, c.job.attempt): (
                "done" if c.job.id in ok else "lease_lost") for c in done})
        if failed:
            rows = store.finish_failed([(c.job.id, c.job.attempt, c.error or "", c.retry_delay)
                                        for c in failed], [c.job.id for c in failed if c.final])
            status = {f.id: f.status for f in rows}
            self._finished(batch, {(c.job.id, c.job.attempt): (
                "lease_lost" if (s := status.get(c.job.id)) is None
                else "retry" if s == "queued" else "failed") for c in failed})

    def _finished(self, batch: list[_Completion], outcomes: dict[tuple[int, int], str]) -> None:
        """Report and remember the completions of ``batch`` that ``outcomes`` names (written)."""
        written = [c for c in batch if (c.job.id, c.job.attempt) in outcomes]
        batch[:] = [c for c in batch if (c.job.id, c.job.attempt) not in outcomes]
        for c in written:
            outcome = outcomes[(c.job.id, c.job.attempt)]
            self._count(outcome)
            if outcome == "lease_lost":
                c.job.lease_lost = True
                log.warning("job %d attempt %d: lease lost before finishing (%s); nothing changed",
                            c.job.id, c.job.attempt, "done" if c.error is None else "failed")
            elif outcome == "failed":  # the failure itself was logged (failure_log)
                log.debug("job %d failed for good after %d attempt(s): %s", c.job.id,
                            c.job.attempt, (c.error or "").splitlines()[0])
            self.observer.on_finish(c.job.claimed, outcome, c.run_seconds)
        with self._lock:  # their tenants' slots are free again: worth a claim
            for c in written:
                self._unwritten.pop((c.job.id, c.job.attempt), None)
            self._hot.update(c.job.queue for c in written)
            if not self.durable_finishes:
                now = time.monotonic()
                self._recent_finishes.append((now, written))
                self._forget_old_finishes(now)
        self._wake.set()  # now, not after the rest of the batch (a held row may take seconds)

    def _count(self, outcome: str) -> None:
        s = self.stats
        with self._lock:  # the finisher counts, and the control thread too while it drains
            s.by_outcome[outcome] = s.by_outcome.get(outcome, 0) + 1
            if outcome == "done":
                s.done += 1
            elif outcome == "retry":
                s.retry += 1
            elif outcome == "failed":
                s.failed += 1
            elif outcome == "lease_lost":
                s.lease_lost += 1

    def _heartbeat_loop(self) -> None:
        """The heartbeat thread: extends the leases of running jobs when they are due, on its
        own connection, whatever the control thread is waiting for."""
        failures = 0
        while not self._heartbeat_exit.is_set():
            with self._lock:
                due = min((r.next_extend for r in (*self._inflight.values(),
                                                   *self._unwritten.values())), default=None)
            now = time.monotonic()
            if due is None or due > now:
                self._heartbeat_wake.wait(None if due is None else due - now)
                self._heartbeat_wake.clear()  # the next turn looks again: nothing is lost
                continue
            try:
                self._heartbeat(self.heartbeat_store, now)
                failures = 0
            except (psycopg.Error, PoolTimeout) as e:
                failures += 1
                delay = min(1.0, 0.05 * 2 ** min(failures, 5))  # a lease is at stake: retry soon
                what = ("lock timeout" if isinstance(e, psycopg.errors.LockNotAvailable)
                        else type(e).__name__)
                log.warning("extending leases failed (%s: %s); retrying in %.2fs", what,
                            str(e).strip()[:200], delay)
                self._heartbeat_exit.wait(delay)
            except Exception:  # a bug must not stop the heartbeats
                log.exception("heartbeat error; retrying in 1s")
                self._heartbeat_exit.wait(1.0)

    def _heartbeat(self, store: Store, now: float) -> None:
        with self._lock:
            due = [r for r in self._inflight.values() if r.next_extend <= now]
            done = [r for r in self._unwritten.values() if r.next_extend <= now]
        if not due and not done:
            return
        ours = store.extend_leases([(r.job.id, r.job.attempt) for r in (*due, *done)])
        for r in done:
            r.next_extend = now + self._heartbeat_every(r.job)
            if r.job.id not in ours:  # its finish will find the lease lost and say so
                with self._lock:
                    self._unwritten.pop((r.job.id, r.job.attempt), None)
        for r in due:
            r.next_extend = now + self._heartbeat_every(r.job)
            if r.job.id not in ours and not r.job.lease_lost:
                r.job.lease_lost = True
                log.warning("job %d attempt %d: lease lost while running (reaped, re-claimed or "
                            "cancelled elsewhere)", r.job.id, r.job.attempt)

    # -- shutdown -------------------------------------------------------------------------
    def _drain(self, store: Store) -> None:
        """Graceful stop: hand back unstarted jobs, let in-flight ones finish within grace."""
        deadline = time.monotonic() + self.grace_period
        unstarted: list[Job] = []
        while True:
            try:
                job = self._pending.get_nowait()
            except queue_mod.Empty:
                break
            if job is not None:
                unstarted.append(job)
        with self._lock:
            for job in unstarted:
                self._inflight.pop((job.id, job.attempt), None)
        if unstarted:
            self._retry_until(deadline, lambda: self._release(store, unstarted))
        while True:
            self._wake.clear()  # before looking, so that a wake-up after the look is not lost
            self._retry_until(deadline, lambda: self._finish_and_heartbeat(store))
            with self._lock:
                if not self._inflight and not self._completions and not self._finishing:
                    return
                next_hb = min((r.next_extend for r in self._inflight.values()),
                              default=deadline)
            if time.monotonic() >= deadline:
                break
            self._wake.wait(max(0.0, min(deadline, next_hb) - time.monotonic()))
        with self._lock:
            left = list(self._inflight.values())
            self._inflight.clear()
        if left:
            log.warning("grace period of %.0fs over: handing back %d running job(s)",
                        self.grace_period, len(left))
            self.stats.abandoned += len(left)
            err = (f"worker {self.worker_id} stopped: "
                   f"grace period of {self.grace_period:g}s exceeded")
            with self._lock:
                self._completions.extend(_Completion(r.job, err, time.monotonic() - r.started, 0.0)
                                         for r in left)
            self._retry_until(time.monotonic() + 5.0, lambda: self._finish_completions(store))

    def _finish_and_heartbeat(self, store: Store) -> None:
        self._finish_completions(store)
        self._heartbeat(store, time.monotonic())

    def _release(self, store: Store, jobs: list[Job]) -> None:
        released = store.release_unstarted([(j.id, j.attempt) for j in jobs])
        self.stats.released += len(released)
        log.info("handed back %d claimed job(s) that had not started", len(released))

    def _retry_until(self, deadline: float, action: Callable[[], None]) -> None:
        """Run ``action`` until it succeeds or ``deadline`` passes (database errors only)."""
        failures = 0
        while True:
            try:
                action()
                return
            except (psycopg.Error, PoolTimeout) as e:
                failures += 1
                if time.monotonic() >= deadline:
                    log.warning("giving up during shutdown (%s); leases will expire", e)
                    return
                time.sleep(min(1.0, 0.05 * 2 ** failures))
