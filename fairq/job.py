"""``fairq.Job``: what a handler receives, and its one way back to the database (the lease)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from fairq.errors import LeaseLost
from fairq.models import ClaimedJob


class LeaseKeeper(Protocol):
    """What a job's lease needs: ``fairq.store.Store``, or the test mode's inline stand-in."""

    def extend_leases(self, jobs: Sequence[tuple[int, int]], seconds: float | None = None, *,
                      started: list[datetime] | None = None) -> Collection[int]: ...


@dataclass(eq=False)
class Job:
    """One claimed attempt of a job.

    ``attempt`` is the claim's attempt number; it fences every write about this attempt, so a
    worker whose lease expired and whose job was re-claimed elsewhere changes nothing.
    """

    id: int
    tenant: str
    payload: Any
    attempt: int
    queue: str
    task: str
    max_attempts: int
    lease_seconds: int
    run_at: datetime
    started_at: datetime
    locked_until: datetime
    claimed: ClaimedJob = field(repr=False)
    _store: LeaseKeeper = field(repr=False)
    lease_lost: bool = False

    @classmethod
    def from_claim(cls, claimed: ClaimedJob, store: LeaseKeeper) -> Job:
        return cls(
            id=claimed.id, tenant=claimed.tenant, payload=claimed.payload,
            attempt=claimed.attempts, queue=claimed.queue, task=claimed.task,
            max_attempts=claimed.max_attempts, lease_seconds=claimed.lease_seconds,
            run_at=claimed.run_at, started_at=claimed.started_at,
            locked_until=claimed.locked_until, claimed=claimed, _store=store,
        )

    @property
    def attempts(self) -> int:
        """Same as ``attempt`` (the column's name)."""
        return self.attempt

    def extend_lease(self, seconds: float | None = None) -> None:
        """Push the lease ``seconds`` (default: the job's lease) from now, at most
        ``fairq.validation.MAX_LEASE_SECONDS`` (``InvalidInput`` beyond it, nothing written).

        Raises ``fairq.LeaseLost`` when the fenced update touches no row: the job was reaped,
        re-claimed, finished or cancelled elsewhere, and this attempt should stop.
        """
        if seconds is not None:
            from fairq.validation import lease_extension

            seconds = lease_extension(seconds)
        if self.id not in self._store.extend_leases([(self.id, self.attempt)], seconds,
                                                    started=[self.started_at]):
            self.lease_lost = True
            raise LeaseLost(f"job {self.id} attempt {self.attempt} is no longer ours")
