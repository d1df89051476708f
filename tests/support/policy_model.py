"""A pure-Python reference model of fairq's scheduling algorithm, for one queue and one claimer.

It is written from the algorithm's definition, not from the SQL that implements it, so property
tests can drive the database and this model with the same operations and demand the same claims.
Time is a plain float the caller passes (``now``); nothing here reads a clock.

State: per tenant a weight ``w``, a cap ``max_running``, the ``running`` count, a virtual time
``vtime``, an ``active`` flag and ``wake_at`` (earliest run_at of an inactive tenant's jobs).
A job is *due* when it is queued and ``run_at <= now``; a tenant's jobs are taken in
(priority DESC, run_at, id) order. A tenant is *runnable* when active and under its cap.

``V``, the queue's virtual time, is where a new tenant starts: the minimum vtime of the runnable
tenants; if none is runnable, the maximum vtime of the active ones; if none is active, 0. An
idle tenant that becomes active again starts at ``max(V, min(vtime, V + max(1, 1 / weight)))``
(*woken*): idle time banks no credit, and it keeps up to one job of the debt it left with.

A fair claim (round_robin, weighted, drr) of batch ``B`` (docs/algorithm.md, "The definition"):

1. wakes every inactive tenant whose ``wake_at <= now`` (woken, ``V`` computed before waking);
   those with a free slot come first in the walk, in tenant order, but those that owe (their
   vtime past the first runnable tenant's) after it;
2. then the runnable tenants in (vtime, tenant) order whose vtime is at most ``B`` ahead of the
   first runnable one (the window);
3. lets each give its due jobs while the job's start (the tenant's vtime before it, counting
   ``unit / u`` per job, ``u`` its weight or 1 when the policy ignores weights, unit its first
   due job's cost for drr, else 1) is within the window, at least one, up to its free slots:
   no share of the batch per tenant, so a claim serves as few tenants as it can;
4. walks them in order, taking that many of each one's due jobs, and stops as soon as the
   batch is full; if it took nothing, it walks the first three runnable
   tenants with a due job, whatever their vtime, each up to its free slots;
5. advances each served tenant's vtime by ``unit / u`` per job (unit = the job's cost for drr,
   else 1) and its ``running`` by the jobs taken;
6. deactivates every walked tenant, and every sleeper, left with no due job (``wake_at`` = its
   earliest queued ``run_at``, None if it has none); tenants not reached are untouched.

Rate limits: a tenant with a ``rate`` (jobs per second, on the ``now`` clock) has a bucket of
``tokens`` as of ``refilled_at`` (None: full), refilled at ``rate`` up to ``burst``. Its *room*
in a claim is its free slots, and at most its whole tokens; room replaces free slots in steps 1,
3 and 4 (the fallback of step 4 only walks tenants with room). A served tenant pays a token per
job; in step 6 a walked tenant, or sleeper, left without a whole token (*dry*) is deactivated
too, with ``wake_at`` = when its next token is due, or its first queued run_at if later (None
if nothing is queued). Changing a rate limit first settles the bucket under the old one (capped
by the new burst) and moves an inactive tenant's future ``wake_at`` to ``now``.

Tenant groups: a group has a weight (``groups``; tenants without one are in ``"default"``,
weight 1). ``refresh_groups`` sets each group's factor to its weight over the summed weights of
its active tenants (the database does it in a claim, at most once a second); a fair claim that
uses weights uses ``weight * factor`` (1 when the group has none) in place of the weight, for
the virtual-time increments.

Policy time (by_time) counts each job its tenant's expected run time ``c`` (``avg_run_s``, 1
second while unknown) where weighted counts 1: the window is ``B * c`` of the first runnable
tenant (in (vtime, name) order), a candidate's jobs start within it at ``c / u`` each (a sleeper
gets ``B`` of its own jobs' worth), and a served tenant's vtime grows by ``n * c / u``. Each job
keeps its charge ``c``. A finish (or retry) that reports the job's run time ``r`` adds
``(r - c) / u`` to an active tenant's vtime (``u`` its effective weight then) and moves
``avg_run_s`` to ``r + (avg_run_s - r) * 0.8`` (the first report sets it; ``r`` is at least
1e-6), under every policy;
a release takes the charge back (``-c / u``) from an active tenant. fifo charges nothing.

fifo takes the first ``B`` due jobs in global (priority DESC, run_at, id) order among tenants
with a free slot, then grants each tenant as many of them as it has free slots; it keeps no
virtual time.

An enqueue wakes an inactive tenant if the job is due (a new tenant starts at V either way),
else moves its ``wake_at`` earlier; a retry frees the slot and moves an inactive tenant's
``wake_at``; a release (or reaped lease) frees the slot and wakes an inactive tenant; a
reconfiguration changes weight and cap and nothing else.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from operator import attrgetter
from typing import Any, Protocol


class Policy(Protocol):
    """What the model reads of a policy: fair ones have params by_weight and by_cost, fifo none."""

    @property
    def name(self) -> str: ...
    @property
    def params(self) -> tuple[tuple[str, Any], ...]: ...


@dataclass(eq=False)
class ModelJob:
    id: int
    tenant: str
    priority: int = 0
    run_at: float = 0.0
    cost: float = 1.0
    charged: float | None = None     # policy time's charge at its claim, in expected seconds

    def order_key(self) -> tuple[int, float, int]:
        """The order a tenant's jobs (and fifo's jobs) are taken in."""
        return (-self.priority, self.run_at, self.id)

    def is_due(self, now: float) -> bool:
        return self.run_at <= now


@dataclass
class ModelTenant:
    name: str
    weight: float = 1.0
    max_running: int = 10
    running: int = 0
    vtime: float = 0.0
    active: bool = True
    wake_at: float | None = None
    rate: float | None = None
    burst: int | None = None
    tokens: float | None = None       # as of refilled_at; None: a full bucket
    refilled_at: float | None = None
    avg_run_s: float | None = None    # expected run time (policy time); None: none measured

    def expected_run(self) -> float:
        """What policy time charges one of its jobs: its moving average, 1 s while unknown."""
        return 1.0 if self.avg_run_s is None else self.avg_run_s

    @property
    def free(self) -> int:
        return self.max_running - self.running

    def tokens_at(self, now: float) -> float | None:
        """The bucket at ``now`` (None without a rate limit)."""
        if self.rate is None or self.burst is None:
            return None
        if self.tokens is None or self.refilled_at is None:
            return float(self.burst)
        return min(float(self.burst), self.tokens + self.rate * (now - self.refilled_at))

    def room(self, now: float) -> int:
        """Jobs a claim may take: free slots, and at most the whole tokens."""
        tokens = self.tokens_at(now)
        return self.free if tokens is None else min(self.free, math.floor(tokens + 1e-9))

    def dry(self, now: float) -> bool:
        tokens = self.tokens_at(now)
        return tokens is not None and tokens + 1e-9 < 1


@dataclass
class QueueModel:
    """One queue's scheduler state. ``queued`` and ``running`` map job ids to jobs."""

    default_weight: float = 1.0
    default_max_running: int = 10
    tenants: dict[str, ModelTenant] = field(default_factory=dict)
    config: dict[str, tuple[float, int, float | None, int | None]] = field(default_factory=dict)
    queued: dict[int, ModelJob] = field(default_factory=dict)
    running: dict[int, ModelJob] = field(default_factory=dict)
    # Each tenant's queued jobs, kept sorted by ModelJob.order_key.
    by_tenant: dict[str, list[ModelJob]] = field(default_factory=dict)
    groups: dict[str, float] = field(default_factory=dict)          # group -> weight
    tenant_group: dict[str, str] = field(default_factory=dict)      # tenant -> group
    factors: dict[str, float] = field(default_factory=dict)         # group -> factor

    def set_group(self, group: str, weight: float) -> None:
        self.groups[group] = weight

    def set_tenant_group(self, tenant: str, group: str | None) -> None:
        if group is None:
            self.tenant_group.pop(tenant, None)
        else:
            self.tenant_group[tenant] = group

    def refresh_groups(self) -> None:
        """Each group's factor: its weight / the weights of its active tenants."""
        active: dict[str, float] = {}
        for t in self.tenants.values():
            if t.active:
                g = self.tenant_group.get(t.name, "default")
                active[g] = active.get(g, 0.0) + t.weight
        self.factors = {g: self.groups.get(g, 1.0) / w for g, w in active.items()}

    def effective_weight(self, t: ModelTenant) -> float:
        return t.weight * self.factors.get(self.tenant_group.get(t.name, "default"), 1.0)

    # -- queries -------------------------------------------------------------------------
    def runnable(self) -> Iterator[ModelTenant]:
        """The tenants a fair claim may serve: active and under their cap."""
        return (t for t in self.tenants.values() if t.active and t.running < t.max_running)

    def activation_vtime(self) -> float:
        """V: min vtime of runnable tenants, else max vtime of active tenants, else 0."""
        runnable_min = min((t.vtime for t in self.runnable()), default=None)
        if runnable_min is not None:
            return runnable_min
        return max((t.vtime for t in self.tenants.values() if t.active), default=0.0)

    def due_jobs(self, tenant: str, now: float) -> Iterator[ModelJob]:
        """The tenant's due jobs, in the order they are taken."""
        return (j for j in self.by_tenant.get(tenant, []) if j.is_due(now))

    def has_due(self, tenant: str, now: float) -> bool:
        return next(self.due_jobs(tenant, now), None) is not None

    # -- internals -----------------------------------------------------------------------
    def _queue(self, job: ModelJob) -> None:
        self.queued[job.id] = job
        bisect.insort(self.by_tenant.setdefault(job.tenant, []), job, key=ModelJob.order_key)

    def _start(self, job: ModelJob) -> None:
        del self.queued[job.id]
        pending = self.by_tenant[job.tenant]
        pending.remove(job)
        if not pending:
            del self.by_tenant[job.tenant]
        self.running[job.id] = job

    def _activate(self, tenant: ModelTenant, vtime: float) -> None:
        tenant.active, tenant.vtime, tenant.wake_at = True, vtime, None

    def _wake(self, tenant: ModelTenant, v: float) -> None:
        """An idle tenant becomes active again: at V, or behind it by the debt it left with, up
        to one job at its weight, or at weight 1 if more (``max(1, 1 / weight)``); never ahead of V."""
        debt = max(1.0, 1.0 / tenant.weight)
        self._activate(tenant, max(v, min(tenant.vtime, v + debt)))

    def _deactivate(self, tenant: ModelTenant, now: float) -> None:
        pending = [j.run_at for j in self.by_tenant.get(tenant.name, [])]
        wake = min(pending) if pending else None
        tokens = tenant.tokens_at(now)
        if wake is not None and tenant.dry(now) and tokens is not None and tenant.rate:
            wake = max(wake, now + (1 - tokens) / tenant.rate)  # the next token
        tenant.active, tenant.wake_at = False, wake

    @staticmethod
    def _earlier(wake_at: float | None, run_at: float) -> float:
        return run_at if wake_at is None else min(wake_at, run_at)

    # -- operations ----------------------------------------------------------------------
    def set_tenant(self, tenant: str, weight: float, max_running: int, rate: float | None = None,
                   burst: int | None = None, now: float = 0.0) -> None:
        """Configure a tenant (known or not yet seen); takes effect immediately. Only a change
        of rate limit moves anything else (the bucket, a sleeping tenant's wake_at)."""
        self.config[tenant] = (weight, max_running, rate, burst)
        t = self.tenants.get(tenant)
        if t is None:
            return
        t.weight, t.max_running = weight, max_running
        if (t.rate, t.burst) != (rate, burst):
            old = t.tokens_at(now)
            had_rate = t.rate is not None
            t.rate, t.burst = rate, burst
            if rate is None or burst is None:
                t.tokens, t.refilled_at = None, None
            else:
                t.tokens = float(burst) if old is None else min(float(burst), old)
                t.refilled_at = now if had_rate else None
            if not t.active and t.wake_at is not None and t.wake_at > now:
                t.wake_at = now

    def enqueue(self, job: ModelJob, now: float, weight: float | None = None,
                max_running: int | None = None) -> None:
        """Queue one job. ``weight``/``max_running`` override the configuration of a new tenant."""
        self.enqueue_many([job], now, weight=weight, max_running=max_running)

    def enqueue_many(self, jobs: Iterable[ModelJob], now: float, weight: float | None = None,
                     max_running: int | None = None) -> None:
        """Queue jobs in one step, as one enqueue statement does. V is computed once, which is
        the same as enqueueing them one by one while some tenant is runnable: a tenant woken at or
        behind V never moves V then."""
        v = self.activation_vtime()
        for job in jobs:
            due = job.is_due(now)
            t = self.tenants.get(job.tenant)
            if t is None:
                cfg_weight, cfg_cap, cfg_rate, cfg_burst = self.config.get(
                    job.tenant, (self.default_weight, self.default_max_running, None, None))
                t = ModelTenant(job.tenant,
                                weight=cfg_weight if weight is None else weight,
                                max_running=cfg_cap if max_running is None else max_running,
                                vtime=v, active=due, wake_at=None if due else job.run_at,
                                rate=cfg_rate, burst=cfg_burst)
                self.tenants[job.tenant] = t
            elif not t.active:
                if due:
                    self._wake(t, v)
                else:
                    t.wake_at = self._earlier(t.wake_at, job.run_at)
            self._queue(job)

    def wake_due(self, now: float) -> int:
        """Wake every inactive tenant whose wake_at has come (V before any); returns how many."""
        woken = [t for t in self.tenants.values()
                 if not t.active and t.wake_at is not None and t.wake_at <= now]
        if woken:
            v = self.activation_vtime()         # before any of them is active
            for t in woken:
                self._wake(t, v)
        return len(woken)

    def claim(self, policy: Policy, batch: int, now: float) -> list[int]:
        """Claim up to ``batch`` due jobs; returns their ids in the order they were taken."""
        if batch <= 0:
            return []
        params = dict(policy.params)
        if "by_weight" not in params:
            return self._claim_fifo(batch, now)
        return self._claim_fair(batch, now, by_weight=bool(params["by_weight"]),
                                by_cost=bool(params.get("by_cost", False)),
                                by_time=bool(params.get("by_time", False)))

    def _claim_fifo(self, batch: int, now: float) -> list[int]:
        # The first `batch` due jobs in global order among tenants with a free slot; then each
        # tenant keeps as many of them as it has free slots (the rest stay queued).
        pool = [job for name in self.by_tenant if self.tenants[name].room(now) > 0
                for job in islice(self.due_jobs(name, now), batch)]
        picked = sorted(pool, key=ModelJob.order_key)[:batch]
        granted: dict[str, int] = {}
        taken: list[ModelJob] = []
        for job in picked:
            t = self.tenants[job.tenant]
            if granted.get(t.name, 0) < t.room(now):
                granted[t.name] = granted.get(t.name, 0) + 1
                taken.append(job)
        for name, n in granted.items():
            t = self.tenants[name]
            tokens = t.tokens_at(now)
            if tokens is not None:
                t.tokens, t.refilled_at = tokens - n, now
        for job in taken:
            self._start(job)
            job.charged = None
            self.tenants[job.tenant].running += 1
        return [j.id for j in taken]

    def _claim_fair(self, batch: int, now: float, *, by_weight: bool, by_cost: bool,
                    by_time: bool = False) -> list[int]:
        # 1. Sleepers whose time came wake (V computed before any wakes); those with a free
        #    slot come first in the walk, in tenant order.
        v = self.activation_vtime()
        vmin = min((t.vtime for t in self.runnable()), default=None)
        before = [t for t in self.runnable()]
        sleepers = sorted((t for t in self.tenants.values()
                           if not t.active and t.wake_at is not None and t.wake_at <= now),
                          key=attrgetter("name"))
        # A sleeper that owes (its vtime past the first runnable tenant's) comes after the walk.
        owes = {t.name for t in sleepers if vmin is not None and t.vtime > vmin}
        for t in sleepers:
            self._wake(t, v)
        # 2. Then the runnable tenants at most `batch` of virtual time ahead of the first (time:
        #    `batch` of the first one's expected run times).
        ordered = sorted(before, key=attrgetter("vtime", "name"))

        def run_unit(t: ModelTenant) -> float:
            return t.expected_run() if by_time else 1.0

        hi = None if vmin is None else vmin + batch * run_unit(ordered[0])
        window = [t for t in ordered if hi is not None and t.vtime <= hi]
        candidates = ([t for t in sleepers if t.room(now) > 0 and t.name not in owes] + window
                      + [t for t in sleepers if t.room(now) > 0 and t.name in owes])

        def units(t: ModelTenant) -> float:
            return self.effective_weight(t) if by_weight else 1.0

        def budget(t: ModelTenant) -> int:
            # 3. Jobs whose start (its vtime before the job, counting 1/u per job) is within
            #    the window; at least one.
            first = next(iter(self.due_jobs(t.name, now)), None)
            if first is None:
                return batch
            unit = first.cost if by_cost else run_unit(t)
            # A sleeper starts at V: a whole window of its own jobs, also when no tenant was
            # runnable (no vmin).
            asleep = any(t is sl for sl in sleepers)
            width = batch * run_unit(t) if asleep or hi is None else hi - t.vtime
            return max(1, math.floor(width * units(t) / unit) + 1)

        walked: list[tuple[ModelTenant, list[ModelJob]]] = []
        count = 0

        walked_bounded: list[bool] = []

        def walk(tenants: list[ModelTenant], *, bounded: bool = True) -> None:
            nonlocal count
            for t in tenants:
                if count >= batch:
                    break
                most = min(t.room(now), budget(t) if bounded else batch, batch - count)
                jobs = list(islice(self.due_jobs(t.name, now), most))
                walked.append((t, jobs))
                walked_bounded.append(bounded)
                count += len(jobs)

        # 4. The walk.
        walk(candidates)
        # 5. Nothing taken although a job is due (with concurrent claimers: all held): the
        #    first three runnable tenants with a due job, whatever their virtual time.
        if count == 0:
            walk([t for t in sorted(self.runnable(), key=attrgetter("vtime", "name"))
                  if self.has_due(t.name, now) and t.room(now) > 0][:3], bounded=False)

        claimed: list[int] = []
        for (t, jobs), bounded in zip(walked, walked_bounded, strict=True):
            for job in jobs:
                self._start(job)
                job.charged = run_unit(t) if by_time else None
                claimed.append(job.id)
            if jobs:
                t.running += len(jobs)
                if by_time and bounded:
                    t.vtime += len(jobs) * run_unit(t) / units(t)   # n * c, then / u
                else:
                    t.vtime += sum((j.cost if by_cost else run_unit(t)) / units(t) for j in jobs)
                tokens = t.tokens_at(now)
                if tokens is not None:
                    t.tokens, t.refilled_at = tokens - len(jobs), now
        # 7. Every tenant served or walked past, and every sleeper, with no due job left or
        #    without a token leaves the runnable set.
        for t in [t for t, _ in walked] + sleepers:
            if t.active and (not self.has_due(t.name, now) or t.dry(now)):
                self._deactivate(t, now)
        return claimed

    def _ran(self, job: ModelJob, t: ModelTenant, run_s: float | None) -> None:
        """The finish of ``job`` reports it ran ``run_s`` seconds (None: nothing reported):
        policy time's charge is corrected on an active tenant, the expected run time moves."""
        if run_s is None:
            return
        run_s = max(run_s, 1e-6)   # as the finishes count it: never 0 (claims divide by it)
        if job.charged is not None and t.active and run_s != job.charged:
            t.vtime = t.vtime + (run_s - job.charged) / self.effective_weight(t)
        old = run_s if t.avg_run_s is None else t.avg_run_s
        t.avg_run_s = run_s + (old - run_s) * 0.8

    def decay(self, factor: float) -> int:
        """Usage decay (a worker's half-life): each active tenant ahead of V keeps ``factor`` of
        its lead over V; returns how many tenants moved."""
        v = self.activation_vtime()
        ahead = [t for t in self.tenants.values() if t.active and t.vtime > v]
        for t in ahead:
            t.vtime = v + (t.vtime - v) * factor
        return len(ahead)

    def finish(self, job_id: int, run_s: float | None = None) -> None:
        """A running job ends for good (done, failed, cancelled while running), having run
        ``run_s`` seconds if reported."""
        job = self.running.pop(job_id)
        t = self.tenants[job.tenant]
        t.running -= 1
        self._ran(job, t, run_s)

    def retry(self, job_id: int, run_at: float, run_s: float | None = None) -> None:
        """A running job failed (after ``run_s`` seconds, if reported) and is queued again at
        ``run_at``."""
        job = self.running.pop(job_id)
        t = self.tenants[job.tenant]
        t.running -= 1
        self._ran(job, t, run_s)
        job.run_at = run_at
        self._queue(job)
        if not t.active:
            t.wake_at = self._earlier(t.wake_at, run_at)

    def release(self, job_id: int, run_at: float | None = None) -> None:
        """A running job goes back to queued, due again (release or lease reaped): an inactive
        tenant is woken. ``run_at`` is its new (due) run_at; None keeps the old one."""
        job = self.running.pop(job_id)
        t = self.tenants[job.tenant]
        t.running -= 1
        if run_at is not None:
            job.run_at = run_at
        self._queue(job)
        if not t.active:
            self._wake(t, self.activation_vtime())
        elif job.charged is not None and job.charged != 0.0:
            # It never ran: policy time's charge is taken back.
            t.vtime = t.vtime + (-job.charged) / self.effective_weight(t)
