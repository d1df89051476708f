"""Plain data passed between the layers: what a claim returns, what a user reads back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Protocol


class ClaimPlan(Protocol):
    """What the store needs of a policy to claim: the statement to run, whether it is run again
    with ``wait`` when it comes back empty, and its bound parameters. A protocol, so that the store
    runs policies without importing them (the policies decide; the store only executes)."""

    @property
    def statement(self) -> str: ...

    @property
    def waits(self) -> bool: ...

    def claim_params(self, *, queue: str, batch: int, worker: str) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class NewJob:
    """One job to insert; validated by the API layer before it reaches the store."""

    task: str
    tenant: str
    payload_json: str
    queue: str = "default"
    priority: int = 0
    cost: float = 1.0
    run_at: datetime | None = None
    delay: float | None = None
    max_attempts: int = 5
    lease_seconds: int = 300
    key: str | None = None  # idempotency key: one queued or running job per (task, key)


@dataclass(frozen=True, slots=True)
class NewJobColumns:
    """Validated jobs as columns, one list per field, all of one length: what the store sends.

    ``App.enqueue_many`` builds it directly (its jobs share everything but tenant and payload),
    so a bulk enqueue makes no per-job object; ``of`` turns ``NewJob``s into it.
    """

    tasks: Sequence[str]
    tenants: Sequence[str]
    payloads_json: Sequence[str]
    queues: Sequence[str]
    priorities: Sequence[int]
    costs: Sequence[float]
    run_ats: Sequence[datetime | None]
    delays: Sequence[float | None]
    max_attempts: Sequence[int]
    lease_seconds: Sequence[int]
    keys: Sequence[str | None] = ()  # empty: no job has a key

    @classmethod
    def of(cls, jobs: Sequence[NewJob]) -> NewJobColumns:
        return cls(
            tasks=[j.task for j in jobs],
            tenants=[j.tenant for j in jobs],
            payloads_json=[j.payload_json for j in jobs],
            queues=[j.queue for j in jobs],
            priorities=[j.priority for j in jobs],
            costs=[j.cost for j in jobs],
            run_ats=[j.run_at for j in jobs],
            delays=[j.delay for j in jobs],
            max_attempts=[j.max_attempts for j in jobs],
            lease_seconds=[j.lease_seconds for j in jobs],
            keys=[j.key for j in jobs] if any(j.key is not None for j in jobs) else (),
        )

    def __len__(self) -> int:
        return len(self.tenants)

    def chunk(self, start: int, stop: int) -> NewJobColumns:
        """Rows ``start`` to ``stop`` (exclusive)."""
        return NewJobColumns(*(getattr(self, f.name)[start:stop] for f in fields(self)))


@dataclass(frozen=True, slots=True)
class UndecodablePayload:
    """Stands for a stored payload that does not decode as JSON in Python (nested deeper than
    its recursion limit, say): the job that holds it fails alone, and ``fairq job`` still
    shows the job, with this in place of its payload."""

    undecodable_payload: str  # why: the decoder's error

    def __str__(self) -> str:
        return f"undecodable payload: {self.undecodable_payload}"


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job a worker now holds a lease on; ``attempts`` fences every later write."""

    id: int
    queue: str
    tenant: str
    task: str
    payload: Any
    attempts: int
    max_attempts: int
    lease_seconds: int
    priority: int
    cost: float
    run_at: datetime
    started_at: datetime
    locked_until: datetime

    @property
    def wait_seconds(self) -> float:
        """Eligible (run_at) to claimed, both on the database clock."""
        return max(0.0, (self.started_at - self.run_at).total_seconds())


@dataclass(frozen=True, slots=True)
class FinishedJob:
    """A finish the database accepted (the job was still ours)."""

    id: int
    queue: str
    tenant: str
    task: str
    status: str
    run_seconds: float


@dataclass(frozen=True, slots=True)
class JobInfo:
    """A job as ``App.job`` shows it."""

    id: int
    queue: str
    tenant: str
    task: str
    payload: Any
    status: str
    priority: int
    cost: float
    run_at: datetime
    attempts: int
    max_attempts: int
    lease_seconds: int
    locked_until: datetime | None
    locked_by: str | None
    last_error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    # A done job's return value, decoded (None: no result; why not is in last_error).
    result: Any = None


@dataclass(frozen=True, slots=True)
class TenantConfig:
    """A tenant's effective weight and cap; ``configured`` is False when it follows the defaults.
    ``rate`` (jobs started per second, None: unlimited) and ``burst`` (how many may start at
    once after idling) are its rate limit."""

    tenant: str
    weight: float
    max_running: int
    configured: bool = True
    running: int = 0
    rate: float | None = None
    burst: int | None = None
    group: str | None = None  # None: the group 'default'


@dataclass(slots=True)
class GroupConfig:
    """A tenant group: its weight among the groups with runnable work; ``tenants`` configured
    in it. ``configured`` is False for the group 'default' while it keeps weight 1."""

    name: str
    weight: float
    configured: bool = True
    tenants: int = 0


# Tenants without their own configuration: (weight, max_running, rate, burst).
TenantDefaults = tuple[float, int, float | None, int | None]


@dataclass(slots=True)
class ReapResult:
    """What one reaper pass did, per queue, and to which jobs: (id, queue, tenant, status)."""

    requeued: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    jobs: list[tuple[int, str, str, str]] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.requeued.values()) + sum(self.failed.values())
