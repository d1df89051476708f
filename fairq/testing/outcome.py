"""What running a job in a test came to (``drain``, ``inline``)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fairq.errors import InvalidInput
from fairq.job import Job


@dataclass(frozen=True)
class Outcome:
    """One attempt a test ran: ``status`` is ``done``, ``retry`` (failed, queued again for a
    later attempt), ``failed`` (for good) or ``lease_lost`` (finished elsewhere meanwhile);
    ``result`` is what the handler returned, ``error`` what it raised."""

    job_id: int
    task: str
    tenant: str
    queue: str
    attempt: int
    status: str
    result: Any = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.status == "done"


def outcome(job: Job, status: str, *, result: Any = None,
            error: BaseException | None = None) -> Outcome:
    """``job``'s attempt as an ``Outcome``."""
    return Outcome(job.id, job.task, job.tenant, job.queue, job.attempt, status, result, error)


def call_sync(fn: Callable[[Job], Any], job: Job, who: str) -> Any:
    """Run a handler in this thread: an ``async def`` one with ``asyncio.run``, which cannot
    run inside an event loop (``who`` says which call of the test mode was made there)."""
    if not inspect.iscoroutinefunction(fn):
        return fn(job)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(fn(job))
    raise InvalidInput(f"{who}: task {job.task!r} is async and this runs inside an event loop"
                       + (": use enqueue_async, which awaits it" if who == "inline" else
                          ": call it from a plain (sync) test"))
