"""``fairq.testing.inline(app)``: while it is active an enqueue runs its task at once, in the
calling thread, after the same validation as a real enqueue; the handler's exception propagates.
Nothing is written: the app's sink is swapped for one that runs the jobs (``fairq.app.ports``)."""

from __future__ import annotations

import functools
import inspect
import itertools
import json
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from fairq.app import App, Task
from fairq.app.hooks import with_hooks
from fairq.errors import InvalidInput
from fairq.job import Job
from fairq.models import ClaimedJob, NewJobColumns, TraceContext
from fairq.testing.outcome import Outcome, call_sync, outcome

# Inline jobs are not stored: their ids are negative, so none is ever a stored job's id.
_ids = itertools.count(-1, -1)
_ids_lock = threading.Lock()


def _next_id() -> int:
    with _ids_lock:
        return next(_ids)


class _NoLease:
    """An inline job's lease: nothing holds it, so extending it always succeeds."""

    def extend_leases(self, jobs: Sequence[tuple[int, int]], seconds: float | None = None, *,
                      started: list[datetime] | None = None) -> Collection[int]:
        return {job_id for job_id, _ in jobs}


class InlineRun:
    """The jobs an ``inline`` block ran, in order (``outcomes``)."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.outcomes: list[Outcome] = []

    def put(self, chunks: Iterator[NewJobColumns], *, connection: Any,
            trace: TraceContext | None) -> list[int]:
        ids: list[int] = []
        for chunk in chunks:
            for job, fn in self._jobs(chunk):
                ids.append(job.id)
                self._record(job, functools.partial(call_sync, fn, job, "inline"))
        return ids

    async def put_async(self, jobs: NewJobColumns, *, connection: Any,
                        trace: TraceContext | None) -> list[int]:
        ids: list[int] = []
        for job, fn in self._jobs(jobs):
            ids.append(job.id)
            if inspect.iscoroutinefunction(fn):
                try:
                    value = await fn(job)
                except Exception as exc:
                    self.outcomes.append(outcome(job, "failed", error=exc))
                    raise
                self.outcomes.append(outcome(job, "done", result=value))
            else:
                self._record(job, functools.partial(fn, job))
        return ids

    def _jobs(self, chunk: NewJobColumns) -> Iterator[tuple[Job, Callable[[Job], Any]]]:
        tasks = with_hooks(self.app.tasks, self.app.attempt_hooks)
        for i in range(len(chunk)):
            name = chunk.tasks[i]
            task: Task[Any] | None = tasks.get(name)
            if task is None:
                raise InvalidInput(f"inline: task {name!r} is not registered with this app, so "
                                   "there is nothing to run (register it with @app.task)")
            yield _job(chunk, i), task.fn

    def _record(self, job: Job, call: Callable[[], Any]) -> None:
        try:
            value = call()
        except Exception as exc:
            self.outcomes.append(outcome(job, "failed", error=exc))
            raise
        self.outcomes.append(outcome(job, "done", result=value))


def _job(chunk: NewJobColumns, i: int) -> Job:
    now = datetime.now(UTC)
    delay = chunk.delays[i]
    run_at = chunk.run_ats[i] or (now + timedelta(seconds=delay) if delay else now)
    lease = chunk.lease_seconds[i]
    claimed = ClaimedJob(
        id=_next_id(), queue=chunk.queues[i], tenant=chunk.tenants[i], task=chunk.tasks[i],
        payload=json.loads(chunk.payloads_json[i]), attempts=1,
        max_attempts=chunk.max_attempts[i], lease_seconds=lease, priority=chunk.priorities[i],
        cost=chunk.costs[i], run_at=run_at, started_at=now,
        locked_until=now + timedelta(seconds=lease))
    return Job.from_claim(claimed, _NoLease())


@contextmanager
def inline(app: App) -> Iterator[InlineRun]:
    """Run every job ``app`` enqueues inside the block at once, in the calling thread (its
    schedule, ``delay`` and ``run_at`` included, is not waited for), and write nothing; the
    handler's exception propagates from the enqueue. Yields the run: its ``outcomes``."""
    run = InlineRun(app)
    before = app.sink
    app.sink = run
    try:
        yield run
    finally:
        app.sink = before
