"""Slots: where handlers run. Sync handlers on slot threads, ``async def`` ones on one
event-loop thread; either way outside any transaction, and every outcome (a return value, an
exception, a job that cannot start) becomes a ``Completion`` for the finisher."""

from __future__ import annotations

import asyncio
import queue as queue_mod
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from fairq.job import Job
from fairq.models import ClaimedJob, UndecodablePayload
from fairq.results import encode_result
from fairq.runtime.failure_log import FailureLog
from fairq.runtime.state import Completion, Running, Shared, describe_error
from fairq.store import Store
from fairq.store.loaders import OutOfRangeTime


class TaskHandler(Protocol):
    """What the runtime needs of a registered task (``fairq.Task`` is one)."""

    @property
    def fn(self) -> Callable[..., Any]: ...

    @property
    def queue(self) -> str: ...

    @property
    def is_async(self) -> bool: ...


class Slots:
    """``concurrency`` slot threads fed from one queue, and the event loop of async handlers."""

    def __init__(self, tasks: Mapping[str, TaskHandler], shared: Shared, concurrency: int,
                 heartbeat_every: Callable[[Job], float], failure_log: FailureLog) -> None:
        self.tasks = tasks
        self.shared = shared
        self.concurrency = concurrency
        self.heartbeat_every = heartbeat_every
        self.failure_log = failure_log
        self._pending: queue_mod.SimpleQueue[Job | None] = queue_mod.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        # At most ``concurrency`` async handlers run at once: the jobs claimed ahead of the
        # slots wait here, as sync ones wait in ``_pending``.
        self._async_gate = asyncio.Semaphore(concurrency)

    def start(self) -> None:
        for i in range(self.concurrency):
            t = threading.Thread(target=self._slot, name=f"fairq-slot-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        if any(t.is_async for t in self.tasks.values()):
            self._async_loop()

    def stop(self) -> None:
        """End the slot threads (once their current job returns) and the event loop."""
        for _ in self._threads:
            self._pending.put(None)
        for t in self._threads:
            t.join(timeout=1.0)
        self._threads.clear()
        if self._loop is not None and self._loop_thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop_thread.join(timeout=1.0)
            if not self._loop_thread.is_alive():
                self._loop.close()
            self._loop = None

    def take_unstarted(self) -> list[Job]:
        """Take back the jobs no slot has started yet (a graceful stop hands them back)."""
        unstarted: list[Job] = []
        while True:
            try:
                job = self._pending.get_nowait()
            except queue_mod.Empty:
                return unstarted
            if job is not None:
                unstarted.append(job)

    def _async_loop(self) -> asyncio.AbstractEventLoop:
        """The event loop for ``async def`` handlers, started on first need."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._loop_thread = threading.Thread(target=self._loop.run_forever,
                                                 name="fairq-async", daemon=True)
            self._loop_thread.start()
        return self._loop

    def _slot(self) -> None:
        while True:
            job = self._pending.get()
            if job is None:
                return
            self.execute(job)

    def execute(self, job: Job) -> None:
        """Run a sync handler (on a slot thread) and complete its job."""
        task = self.tasks[job.task]
        t0 = time.monotonic()
        error: str | None = None
        value = None
        try:
            value = task.fn(job)
        except BaseException as e:  # KeyboardInterrupt/SystemExit in a handler fail the job only
            error = describe_error(e)
        self.complete(job, error, time.monotonic() - t0, result=encode_result(value))

    async def execute_async(self, job: Job) -> None:
        task = self.tasks[job.task]
        async with self._async_gate:
            t0 = time.monotonic()
            error: str | None = None
            value = None
            try:
                value = await task.fn(job)
            except BaseException as e:
                error = describe_error(e)
        self.complete(job, error, time.monotonic() - t0, result=encode_result(value))

    def complete(self, job: Job, error: str | None, seconds: float,
                 retry_delay: float | None = None,
                 result: tuple[str | None, str | None] = (None, None),
                 final: bool = False) -> None:
        """Queue the job's outcome for the finisher; its lease is kept until it is written."""
        sh = self.shared
        with sh.lock:
            running = sh.inflight.pop((job.id, job.attempt), None)
            if running is None:
                return  # abandoned after the grace period: already handed back
            sh.unwritten[(job.id, job.attempt)] = running
            sh.note_run(seconds)
            sh.completions.append(Completion(job, error, seconds, retry_delay, *result,
                                             final=final))
        if error is not None:
            self.failure_log.failed(job, error)
        sh.finish_wake.set()
        sh.wake.set()  # a slot is free

    def dispatch(self, store: Store, claimed: Sequence[ClaimedJob]) -> None:
        """Put claimed jobs in flight and hand each to its handler."""
        now = time.monotonic()
        sh = self.shared
        for c in claimed:
            job = Job.from_claim(c, store)
            with sh.lock:
                sh.inflight[(job.id, job.attempt)] = Running(
                    job, now, now + self.heartbeat_every(job))
            try:
                self._hand_over(job)
            except Exception as e:  # this job fails; the rest of the batch runs
                self.complete(job, f"could not start the job: {describe_error(e)}", 0.0)
        sh.heartbeat_wake.set()  # new leases to keep

    def _hand_over(self, job: Job) -> None:
        """Give a claimed (and in-flight) job to its handler, or fail it when it cannot run."""
        if isinstance(job.payload, UndecodablePayload):
            self.complete(job, f"payload cannot be decoded ({job.payload.undecodable_payload}); "
                          "failed without retries", 0.0, final=True)
            return
        if isinstance(job.run_at, OutOfRangeTime):  # the one time of a claim a user can set
            self.complete(job, f"run_at {job.run_at} cannot be decoded: it is outside the years "
                          "Python can hold (run_at must be between 1970-01-01 and 9999-01-01 "
                          "UTC); failed without retries", 0.0, final=True)
            return
        task = self.tasks.get(job.task)
        if task is None:
            known = ", ".join(sorted(self.tasks)) or "nothing"
            self.complete(job, f"unknown task {job.task!r}: this worker knows {known}", 0.0)
        elif task.is_async:
            asyncio.run_coroutine_threadsafe(self.execute_async(job), self._async_loop())
        else:
            self._pending.put(job)
