"""What the worker's threads share: the jobs in flight, the completions to write, the counts,
and the events that wake each thread; plus the small types they pass around.

One lock guards it all: the control thread, the slots, the finisher and the heartbeat thread
each take it for a few dictionary operations, never across a database round trip.
"""

from __future__ import annotations

import logging
import threading
import traceback
from dataclasses import dataclass, field

from fairq.job import Job
from fairq.runtime.outage import Outage

# One logger for the whole runtime: operators filter on "fairq.worker" (docs/deployment.md).
log = logging.getLogger("fairq.worker")

MAX_ERROR_CHARS = 4000
RUN_AVERAGE_WEIGHT = 0.1  # each run's share of the moving average: about the last 10 runs


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
class Running:
    """A job handed to a slot (or whose finish is not written yet) and when its lease is due."""

    job: Job
    started: float  # monotonic, when handed to a slot
    next_extend: float


@dataclass
class Completion:
    """A handler's outcome, waiting for the finisher to write it."""

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


Key = tuple[int, int]  # (job id, attempt): what fences every write about one attempt


class Shared:
    """The state every thread of one worker reads and writes, under ``lock``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stats = WorkerStats()
        # The control thread's wake-up: a slot freed, a finish written, a NOTIFY, stop().
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.finish_wake = threading.Event()  # completions to write
        self.heartbeat_wake = threading.Event()  # new leases to keep
        self.inflight: dict[Key, Running] = {}
        # Jobs whose handler returned and whose finish is not written yet (a held lock may
        # delay it for a while): the heartbeat thread keeps their leases too.
        self.unwritten: dict[Key, Running] = {}
        self.completions: list[Completion] = []
        self.finishing = 0  # completions taken by a finish that has not returned yet
        self.hot: set[str] = set()  # queues worth a claim without waiting for a poll
        self.poll_now = True
        # When the first idle tenant of a queue whose claim came back short is due to wake (a
        # delayed job, a rate-limited tenant's next token): a poll then, not at poll_interval.
        self.tenant_wake: float | None = None
        # A moving average of handlers' run times (None until one returns): the loop claims
        # ahead of its slots only while jobs are short (fairq.runtime.loop).
        self.run_seconds: float | None = None
        # The database connection as every thread sees it: one log line when it is lost, one
        # when it is back; the reaper's grace (fairq.runtime.outage).
        self.outage = Outage(log)

    def note_run(self, seconds: float) -> None:
        """Fold one handler's run time into ``run_seconds`` (caller holds the lock)."""
        prev = self.run_seconds
        self.run_seconds = seconds if prev is None else prev + RUN_AVERAGE_WEIGHT * (seconds - prev)

    def count(self, outcome: str) -> None:
        """Count a written finish (the finisher counts, and the control thread while it drains)."""
        s = self.stats
        with self.lock:
            s.by_outcome[outcome] = s.by_outcome.get(outcome, 0) + 1
            if outcome == "done":
                s.done += 1
            elif outcome == "retry":
                s.retry += 1
            elif outcome == "failed":
                s.failed += 1
            elif outcome == "lease_lost":
                s.lease_lost += 1

    def count_db_error(self) -> None:
        with self.lock:
            self.stats.db_errors += 1

    def wake_tenants_at(self, at: float) -> None:
        """Poll at ``at`` (monotonic) unless an earlier tenant wake-up is already noted."""
        with self.lock:
            if self.tenant_wake is None or at < self.tenant_wake:
                self.tenant_wake = at

    def settled(self) -> bool:
        """Nothing runs here and every completion is written (caller holds the lock)."""
        return not self.inflight and not self.completions and not self.finishing
