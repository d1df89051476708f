"""What running a job in a test came to (``drain``, ``inline``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
