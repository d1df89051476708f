"""Maintenance services every worker runs from start-up: reaper, wakers, rebase, pruner and
usage decay.

Each service is a small object whose ``run_once()`` does one pass, so tests drive it without
timers. ``MaintenanceSchedule`` decides when: a local timer says when this worker should *ask*,
and ``store.maintenance_due`` (a row in ``settings``) lets exactly one asking worker per
interval do the work, so a hundred workers do not all reap at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from fairq.models import ReapResult
from fairq.observe import NullObserver, WorkerObserver
from fairq.runtime.periodic import Periodic, latest_tick, next_tick
from fairq.store import Store
from fairq.store.errors import InsufficientPrivilege

log = logging.getLogger("fairq.maintenance")

# ScheduleVacuum: how often one worker asks whether tenant_schedule needs a VACUUM, how many
# dead rows make it worth one, and how long a few dead rows may wait for one.
DEFAULT_VACUUM_INTERVAL = 1.0
DEFAULT_VACUUM_MIN_DEAD = 1000
DEFAULT_VACUUM_MAX_AGE = 10.0
# PeriodicScheduler: how often each worker looks for due ticks (an idle worker looks only on
# its polls, so a tick may wait up to its poll interval).
DEFAULT_PERIODIC_INTERVAL = 1.0


class Service(Protocol):
    key: str
    interval: float

    def run_once(self) -> int:
        """One pass; returns how many rows it changed."""


# The reaper's log line names at most this many tenants, and this many job ids per tenant.
REAP_LOG_TENANTS = 10
REAP_LOG_IDS = 5


def reaped_summary(jobs: Sequence[tuple[int, str, str, str]]) -> str:
    """Whose leases were reaped, bounded: ``acme (jobs 4, 5), globex (job 9), ... and 3 more
    tenant(s)``; the count of each tenant's jobs is always there, the ids up to a few."""
    by_tenant: dict[str, list[int]] = {}
    for job_id, _queue, tenant, _status in jobs:
        by_tenant.setdefault(tenant, []).append(job_id)
    ranked = sorted(by_tenant.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    parts = []
    for tenant, ids in ranked[:REAP_LOG_TENANTS]:
        shown = ", ".join(str(i) for i in sorted(ids)[:REAP_LOG_IDS])
        more = f", +{len(ids) - REAP_LOG_IDS} more" if len(ids) > REAP_LOG_IDS else ""
        parts.append(f"{tenant} ({'job' if len(ids) == 1 else f'{len(ids)} jobs'} {shown}{more})")
    if len(ranked) > REAP_LOG_TENANTS:
        parts.append(f"and {len(ranked) - REAP_LOG_TENANTS} more tenant(s)")
    return ", ".join(parts)


def reap_pinned(store: Store, limit: int, stall: float) -> ReapResult | None:
    """A reap pinned to a time the database answered promptly (``Store.reap_expired`` with
    ``stall``): None, and a line, when its first statement took longer (decision 019)."""
    began = time.monotonic()
    result = store.reap_expired_pinned(limit, stall)
    if result is None:
        log.info("reaper: the database took %.1fs to answer; not reaping now",
                 time.monotonic() - began)
    return result


def reap_and_report(store: Store, observer: WorkerObserver, limit: int = 1000, *,
                    stall: float | None = None) -> ReapResult:
    """One reap: expired leases back to the queue (or failed at max_attempts), counted in the
    observer and logged with how many and whose. The maintenance reaper and a drain both use it,
    so a lease reaped by either is never silent. ``stall``: a worker's (``Outage.stall``), the
    reap runs as ``reap_pinned`` (nothing reaped when its first statement is that slow)."""
    if stall is None:
        result = store.reap_expired(limit=limit)
    else:
        result = reap_pinned(store, limit, stall) or ReapResult()
    for queue in sorted(set(result.requeued) | set(result.failed)):
        failed = result.failed.get(queue, 0)
        observer.on_reap(queue, result.requeued.get(queue, 0) + failed, failed)
    if result.total:
        failed = sum(result.failed.values())
        log.info("reaped %d expired lease(s): %d back in the queue, %d failed at max_attempts; "
                 "tenants: %s", result.total, result.total - failed, failed,
                 reaped_summary(result.jobs))
    return result


@dataclass
class Reaper:
    """Expired leases back to the queue, or failed at max_attempts."""

    store: Store
    interval: float = 5.0
    observer: WorkerObserver = field(default_factory=NullObserver)
    limit: int = 1000
    key: str = "reap"
    # Whether this process may reap now (the worker's: connected long enough, decision 016).
    ready: Callable[[], bool] = lambda: True
    # The worker's Outage.stall: each reap runs as reap_pinned (decision 019).
    stall: float | None = None

    def run_once(self) -> int:
        total = 0
        # Asked again before each reap: the statement that elected this worker (or the last
        # reap) may be the one a stalled database kept waiting (decision 019).
        while self.ready():
            result = reap_and_report(self.store, self.observer, self.limit, stall=self.stall)
            total += result.total
            if result.total < self.limit:
                break
        return total


@dataclass
class DueWaker:
    """Idle tenants whose delayed jobs or retries are due become runnable again."""

    store: Store
    interval: float = 1.0
    key: str = "wake_due"

    def run_once(self) -> int:
        return self.store.wake_due_tenants()


@dataclass
class StrandedWaker:
    """A check that should find nothing: an idle tenant with a due job.

    Claims retire a tenant under a lock that enqueues, reaps and retries conflict with
    (docs/algorithm.md), so none should be stranded; if one is, it is woken and reported.
    """

    store: Store
    interval: float = 30.0
    key: str = "wake_stranded"

    def run_once(self) -> int:
        n = self.store.wake_stranded_tenants()
        if n:
            log.warning("woke %d idle tenant(s) that had due jobs: please report this", n)
        return n


# ScheduleRepair walks the distinct (queue, tenant) pairs of the queued jobs, one index descent
# each (about 10 us: a second at 100,000 pairs), so one worker does it every five minutes.
DEFAULT_REPAIR_INTERVAL = 300.0


@dataclass
class ScheduleRepair:
    """A check that should find nothing: queued jobs whose (queue, tenant) has no schedule row
    (no claim would ever find them). Enqueues create their rows under the tenants' settings
    locks and make them again when a delete took them (decision 020); if one is missing anyway
    its row is made from its tenant's settings, and the pairs are reported."""

    store: Store
    interval: float = DEFAULT_REPAIR_INTERVAL
    key: str = "repair_schedule"
    limit: int = 1000
    disabled: bool = False

    def run_once(self) -> int:
        if self.disabled:
            return 0
        try:
            made = self.store.repair_schedule(self.limit)
        except InsufficientPrivilege:
            self.disabled = True
            log.warning("cannot repair schedule rows: this worker's role may not run "
                        "repair_schedule; run `fairq roles` again (docs/roles.md)")
            return 0
        if made:
            shown = ", ".join(f"{q}/{t}" for q, t in made[:5])
            log.warning("made the missing schedule row of %d (queue, tenant) with queued jobs "
                        "(%s%s): please report this", len(made), shown,
                        ", ..." if len(made) > 5 else "")
        return len(made)


@dataclass
class ReturnsSweep:
    """Folds slots given back to tenants that no claim has served since (an idle tenant's last
    jobs) into their running counts, so the counts the claims read stay close to the truth.

    A finish that finds its tenant's row held leaves the slot in ``slot_returns`` (the
    ``return_slots`` function) for whoever holds the row next; a tenant with no due job is not
    served again, so its last slots would wait there until it has work.
    """

    store: Store
    interval: float = 1.0
    age: float = 1.0
    key: str = "fold_returns"

    def run_once(self) -> int:
        return self.store.fold_stale_returns(self.age)


@dataclass
class VtimeRebase:
    """Keeps virtual times small, so increments are never lost to float rounding."""

    store: Store
    interval: float = 60.0
    key: str = "rebase_vtime"

    def run_once(self) -> int:
        n = self.store.rebase_vtime()
        if n:
            log.info("rebased the virtual time of %d tenant row(s)", n)
        return n


@dataclass
class UsageDecay:
    """Forgets old usage with a half-life: every ``interval`` seconds each active tenant of
    ``queues`` keeps ``0.5 ** (interval / half_life)`` of its lead in virtual time over its
    queue's (docs/algorithm.md, "Policy time")."""

    store: Store
    queues: Sequence[str]
    half_life: float
    interval: float = 1.0
    key: str = ""

    def __post_init__(self) -> None:
        # One schedule per set of queues: workers serving other queues decay theirs too.
        self.key = self.key or "decay_usage:" + ",".join(sorted(self.queues))

    def run_once(self) -> int:
        return self.store.decay_usage(self.queues, 0.5 ** (self.interval / self.half_life))


@dataclass
class Pruner:
    """Deletes finished jobs older than ``max_age`` seconds, in batches."""

    store: Store
    max_age: float
    interval: float = 60.0
    key: str = "prune"

    def run_once(self) -> int:
        n = self.store.prune_finished(self.max_age)
        if n:
            log.info("pruner: deleted %d finished job(s) older than %ss", n, self.max_age)
        return n


@dataclass
class ScheduleVacuum:
    """Keeps ``tenant_schedule``'s indexes short between autovacuum runs.

    Every claim moves its tenants' virtual time and every finish their running count, both
    indexed, so each leaves index entries dead. A fair claim starts at the front of the
    runnable index and steps over every entry left dead there since the last VACUUM: at 10,000
    tenants a claim read 440-472 buffers with a VACUUM every 10 s, 325-362 with this pacing
    (fifo's: 544-554; docs/algorithm.md). So one worker per ``interval`` asks the statistics,
    and vacuums once ``min_dead`` rows died (about a second of claims under load), or any died
    over ``max_age`` seconds ago; an idle table costs one statistics read per interval.

    VACUUM needs the table's owner: PostgreSQL skips the table with a warning for other roles,
    and should it raise instead, the service logs once and stops trying; either way the table
    is left to autovacuum.
    """

    store: Store
    interval: float = DEFAULT_VACUUM_INTERVAL
    min_dead: int = DEFAULT_VACUUM_MIN_DEAD
    max_age: float = DEFAULT_VACUUM_MAX_AGE
    key: str = "vacuum_schedule"
    disabled: bool = False
    vacuums: int = 0

    def run_once(self) -> int:
        if self.disabled or not self.store.schedule_vacuum_due(self.min_dead, self.max_age):
            return 0
        try:
            self.store.vacuum_tenant_schedule()
            self.vacuums += 1
        except InsufficientPrivilege:
            self.disabled = True
            log.warning("cannot VACUUM tenant_schedule (not its owner): leaving it to autovacuum")
        return 0


@dataclass
class PeriodicScheduler:
    """Enqueues the due ticks of the app's periodic schedules (``App.periodic``).

    Every worker checks its own app's schedules each ``interval`` (one read: the database clock
    and the schedules' last ticks), not one elected worker: workers of different apps sharing a
    schema each declare their own. That a tick is enqueued once is the database's doing: the
    conditional update of ``periodic_fire`` lets one worker claim it, whatever their number.

    After downtime only the latest missed tick is enqueued: a job is for "the run due now", not
    a backlog. A schedule seen for the first time starts at its next tick.
    """

    store: Store
    schedules: Mapping[tuple[str, str], Periodic]
    interval: float = DEFAULT_PERIODIC_INTERVAL
    key: str = "periodic"
    elected: bool = False  # see above: MaintenanceSchedule asks no leader for this service
    observer: WorkerObserver = field(default_factory=NullObserver)  # counts the enqueues
    disabled: bool = False
    # (name, tenant) -> (last tick seen, the tick after it): skips the cron maths while not due
    _after: dict[tuple[str, str], tuple[datetime, datetime]] = field(default_factory=dict)

    def run_once(self) -> int:
        """One pass. A role that may not enqueue (the least-privilege worker without the
        producer's grants, docs/roles.md) logs once and stops trying; the worker goes on."""
        if self.disabled or not self.schedules:
            return 0
        try:
            return self._run()
        except InsufficientPrivilege as exc:
            self.disabled = True
            log.warning("periodic schedules disabled in this worker: its role may not enqueue "
                        "(%s); grant it the producer's grants and the periodic table's (docs/"
                        "roles.md)", str(exc).strip().splitlines()[0])
            return 0

    def _run(self) -> int:
        schedules = list(self.schedules.values())
        now, last = self.store.periodic_state([s.key for s in schedules])
        fired = 0
        for s in schedules:
            prev = last.get(s.key)
            if prev is None:
                self.store.periodic_register(s.name, s.tenant, s.task, s.cron,
                                             latest_tick(s.cron, now))
                continue
            seen = self._after.get(s.key)
            if seen is None or seen[0] != prev:
                seen = self._after[s.key] = (prev, next_tick(s.cron, prev))
            if seen[1] > now:
                continue
            tick = latest_tick(s.cron, now)  # missed ticks before it are skipped
            job_id = self.store.periodic_fire(s.name, s.tenant, s.cron, tick, s.job_for(tick))
            if job_id is not None:
                fired += 1
                self.observer.on_enqueue(s.job.queue, s.tenant, 1)
                log.info("periodic %r for tenant %r: enqueued job %d for the tick of %s",
                         s.name, s.tenant, job_id, tick.isoformat())
        return fired


class MaintenanceSchedule:
    """When each service runs: at start-up, then each interval, by one worker per interval."""

    def __init__(self, store: Store, services: Sequence[Service],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.services = list(services)
        self._clock = clock
        self._next = {s.key: clock() for s in self.services}  # everything is due at start-up

    def next_due(self) -> float:
        """Monotonic time of the next local check (inf without services)."""
        return min(self._next.values(), default=float("inf"))

    def run_due(self, *, leader_check: bool = True) -> int:
        """Run the services whose local timer expired; returns rows changed in total.

        Database errors propagate (the worker backs off and reconnects); the timer is moved on
        first, so a failing service does not hot-loop.
        """
        changed = 0
        now = self._clock()
        for s in self.services:
            if self._next[s.key] > now:
                continue
            self._next[s.key] = now + s.interval
            ready = getattr(s, "ready", None)
            if ready is not None and not ready():
                continue  # not even asking: another worker may do it this interval
            # A little under the interval: our timer and the database clock need not agree.
            if (leader_check and getattr(s, "elected", True)
                    and not self.store.maintenance_due(s.key, s.interval * 0.9)):
                continue
            changed += s.run_once()
        return changed
