"""Plain data passed between the layers: what a claim returns, what a user reads back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Literal, Protocol


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
    key: str | None = None  # idempotency key: one queued or running job per (task, tenant, key)


@dataclass(frozen=True, slots=True)
class TraceContext:
    """A W3C trace context stored with the jobs of one enqueue (``fairq.otel``): the
    ``traceparent`` header's value and, if any, ``tracestate``'s."""

    traceparent: str
    tracestate: str | None = None


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
    # The settings' version: 1 when first written, one more at every change (a trigger on the
    # tenants table counts it, whoever writes); 0 for a tenant without settings of its own.
    # A person's edit names the version it showed (``expected_version``) and is refused when
    # another change came in between.
    version: int = 0


# The fields a TenantPatch can set, in the order they are shown.
PATCH_FIELDS = ("weight", "max_running", "rate", "burst", "group")


@dataclass(frozen=True, slots=True)
class TenantPatch:
    """A change to one tenant's settings: the fields it names and nothing else (the others keep
    whatever they hold when the change is applied, by one statement in the database, so two
    operators changing different fields never undo each other). Built by
    ``fairq.validation.tenant_patch`` from every surface (API, CLI, console, tenants file), which
    checks each value; ``rate=None`` in ``fields`` removes the limit, ``group=None`` puts the
    tenant back in the group 'default'."""

    tenant: str
    fields: frozenset[str]
    weight: float | None = None
    max_running: int | None = None
    rate: float | None = None
    burst: int | None = None
    group: str | None = None

    def sets(self, name: str) -> bool:
        """Whether the patch names ``name`` (a field of PATCH_FIELDS)."""
        return name in self.fields


@dataclass(slots=True)
class GroupConfig:
    """A tenant group: its weight among the groups with runnable work; ``tenants`` configured
    in it. ``configured`` is False for the group 'default' while it keeps weight 1."""

    name: str
    weight: float
    configured: bool = True
    tenants: int = 0


# Why a tenant's next job has not started, in the order the reasons are checked
# (docs/explain.md): the first that holds is the answer.
WaitReason = Literal["no_jobs", "no_worker", "running", "at_cap", "rate_limited", "no_due_jobs",
                     "group_at_share", "waiting_turn"]
WAIT_REASONS: tuple[WaitReason, ...] = (
    "no_jobs", "no_worker", "running", "at_cap", "rate_limited", "no_due_jobs", "group_at_share",
    "waiting_turn")


@dataclass(frozen=True, slots=True)
class TenantExplanation:
    """Why a tenant's next job in one queue has not started, as the database had it at
    ``checked_at`` (``app.tenants.explain``, docs/explain.md). ``queue`` is None only for a
    tenant with no job in any queue (``no_jobs``). The details hold whatever the reason: the
    ones it names are those it rests on."""

    tenant: str
    queue: str | None
    reason: WaitReason
    queued: int = 0          # queued jobs, due or delayed
    due: int = 0             # queued jobs due now
    running: int = 0         # running now (the scheduler's exact count)
    max_running: int | None = None  # its cap in this queue (0: paused)
    cap_is_default: bool = True     # the cap (and weight) come from the tenant defaults
    next_due_at: datetime | None = None    # no_due_jobs: when its first queued job falls due
    rate: float | None = None              # its rate limit, jobs per second
    tokens: float | None = None            # its token bucket now
    next_token_at: datetime | None = None  # without a whole token: when the next one comes
    ahead: int = 0               # competing tenants before it in the claim's virtual-time order
    ahead_other_groups: int = 0  # of them, those of other groups
    tenant_group: str = "default"
    group_running: int = 0       # its group's running jobs in the queue
    group_share: float | None = None  # its group's share of the queue (engine factors)
    queue_running: int = 0       # the queue's running jobs
    workers: int = 0             # live workers serving the queue
    policies: tuple[str, ...] = ()   # their policies
    last_worker_seen_at: datetime | None = None  # no_worker: the last beat of a dead one
    checked_at: datetime | None = None  # the database's time of the reading

    def describe(self) -> str:
        """One line for people: the reason and the facts it rests on."""
        return f"{self.queue or '-'}: {self.reason}: {_why(self)}"


def _seconds_from(at: datetime | None, now: datetime | None) -> str:
    if at is None:
        return "unknown"
    if now is None:
        return at.isoformat()
    return f"{at.isoformat()} (in {max(0.0, (at - now).total_seconds()):.1f}s)"


def _why(e: TenantExplanation) -> str:
    """The facts behind ``e.reason``, in words."""
    if e.reason == "no_jobs":
        return "no queued or running job" + ("" if e.queue else " in any queue")
    if e.reason == "no_worker":
        seen = ("" if e.last_worker_seen_at is None
                else f"; the last one was seen at {e.last_worker_seen_at.isoformat()}")
        return f"no live worker serves this queue ({e.queued} queued, {e.running} running){seen}"
    if e.reason == "running":
        return f"{e.running} running, none queued"
    if e.reason == "at_cap":
        cap = "the default cap" if e.cap_is_default else "its cap"
        if e.max_running == 0:
            return f"paused ({cap} max_running is 0); {e.queued} queued"
        return f"{e.running} running of {cap} max_running={e.max_running}; {e.queued} queued"
    if e.reason == "rate_limited":
        return (f"no whole token of its rate limit {e.rate:g}/s; the next at "
                f"{_seconds_from(e.next_token_at, e.checked_at)}; {e.queued} queued")
    if e.reason == "no_due_jobs":
        return (f"{e.queued} queued, none due; the first falls due at "
                f"{_seconds_from(e.next_due_at, e.checked_at)}")
    share = "-" if e.group_share is None else f"{100 * e.group_share:.0f}%"
    if e.reason == "group_at_share":
        return (f"group {e.tenant_group} runs {e.group_running} of the queue's "
                f"{e.queue_running} jobs, its share being {share}; {e.ahead_other_groups} "
                f"tenant(s) of other groups ahead")
    return f"{e.ahead} tenant(s) ahead in virtual-time order; {e.due} due, {e.running} running"


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
