"""One WARNING line per handler failure, rate-limited.

A failing handler is otherwise visible only in the job's ``last_error``. A flood of failures
(a bad deploy, a dependency down) must not drown the log, so at most ``limit`` lines are written
per ``window`` seconds; the rest are counted and summed up in one line when the window ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from fairq.job import Job

log = logging.getLogger("fairq.worker")

DEFAULT_LIMIT = 10
DEFAULT_WINDOW = 10.0


def first_line(error: str) -> str:
    """The error's first non-empty line: ``Type: message`` for a handler's exception."""
    for line in error.splitlines():
        if line.strip():
            return line.strip()[:500]
    return "(no message)"


class FailureLog:
    """Logs handler failures: ``limit`` lines per ``window`` seconds, then one summary line."""

    def __init__(self, limit: int = DEFAULT_LIMIT, window: float = DEFAULT_WINDOW,
                 logger: logging.Logger = log,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.window = window
        self.logger = logger
        self.clock = clock
        self._lock = threading.Lock()
        self._start = -float("inf")
        self._logged = 0
        self._suppressed = 0
        self._timer: threading.Timer | None = None

    def failed(self, job: Job, error: str) -> None:
        """A handler raised (or the task is unknown): say so, unless over the limit."""
        with self._lock:
            now = self.clock()
            if now - self._start >= self.window:
                self._summary_locked()
                self._start, self._logged = now, 0
            if self._logged >= self.limit:
                self._suppressed += 1
                if self._timer is None:  # the summary comes even if no failure follows
                    self._timer = threading.Timer(max(0.0, self._start + self.window - now),
                                                  self.flush)
                    self._timer.daemon = True
                    self._timer.start()
                return
            self._logged += 1
        self.logger.warning("job %d failed (tenant %r, task %r, attempt %d of %d): %s",
                            job.id, job.tenant, job.task, job.attempt, job.max_attempts,
                            first_line(error))

    def flush(self) -> None:
        """Write the summary of the failures not logged so far (the window's end, or a stop)."""
        with self._lock:
            self._summary_locked()

    def _summary_locked(self) -> None:
        self._timer = None
        if self._suppressed:
            self.logger.warning("%d more handler failure(s) not logged in the last %.0fs (at "
                                "most %d lines per %.0fs; see `fairq jobs --status failed`)",
                                self._suppressed, self.window, self.limit, self.window)
            self._suppressed = 0
