"""A pure-Python reference model of the claim statements, for one queue and one claimer at a time.

It mirrors ``fairq/sql/claim.sql`` step by step, so property tests can drive the database and
the model with the same operations and demand the same claims. It is also the clearest statement
of the algorithm:

* fair policies keep a virtual time per tenant; a claim scans runnable tenants (active, under
  their cap, and at most one batch of virtual time ahead of the queue's minimum) in
  (vtime, tenant) order, takes from each at most its weighted share of the batch
  (and never more than its free slots), stops when the batch is full, then advances each served
  tenant's vtime by ``unit / weight`` per job (unit = 1, or the job's cost for drr);
* a tenant found with no due job leaves the runnable set (``active`` = False) and wakes at its
  earliest queued ``run_at``; on waking, or on an enqueue, its vtime is set to the queue's
  current virtual time (the minimum over runnable tenants; if all are capped the maximum over
  active ones; if none is active 0), so idle time banks neither credit nor debt;
* under contention (a claim's first statement came back short and the waiting statement found
  more), the next claims start with claim_fair_greedy: the same order and window, but each tenant
  may give the rest of the batch (so concurrent claimers spread over tenants), and a tenant that
  gave nothing is left active for the other statements to deactivate;
* fifo takes jobs in (priority desc, run_at, id) order, skipping tenants at their cap.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from fairq.policies.base import Policy

CONTENDED_CLAIMS = 16  # mirrors fairq.store.pg (the model must not import the store)


@dataclass(eq=False)
class ModelJob:
    id: int
    tenant: str
    priority: int = 0
    run_at: float = 0.0
    cost: float = 1.0

    def order_key(self) -> tuple[int, float, int]:
        return (-self.priority, self.run_at, self.id)


@dataclass
class ModelTenant:
    name: str
    weight: float = 1.0
    max_running: int = 10
    running: int = 0
    vtime: float = 0.0
    active: bool = True
    wake_at: float | None = None


@dataclass
class QueueModel:
    """One queue's scheduler state; time is a plain float the caller advances."""

    tenant_scan: int = 64
    tenants: dict[str, ModelTenant] = field(default_factory=dict)
    queued: dict[int, ModelJob] = field(default_factory=dict)
    running: dict[int, ModelJob] = field(default_factory=dict)
    by_tenant: dict[str, list[ModelJob]] = field(default_factory=dict)
    contended: dict[str, int] = field(default_factory=dict)

    # -- helpers -------------------------------------------------------------------------
    def _runnable(self) -> list[ModelTenant]:
        return [t for t in self.tenants.values() if t.active and t.running < t.max_running]

    def virtual_now(self) -> float | None:
        runnable = self._runnable()
        return min(t.vtime for t in runnable) if runnable else None

    def activation_vtime(self) -> float:
        """Where a tenant that becomes active starts: runnable minimum, else active maximum, else 0."""
        vnow = self.virtual_now()
        if vnow is not None:
            return vnow
        active = [t.vtime for t in self.tenants.values() if t.active]
        return max(active) if active else 0.0

    def _due(self, tenant: str, now: float, limit: int | None = None) -> list[ModelJob]:
        due: list[ModelJob] = []
        for j in self.by_tenant.get(tenant, []):
            if limit is not None and len(due) >= limit:
                break
            if j.run_at <= now:
                due.append(j)
        return due

    def _push(self, job: ModelJob) -> None:
        self.queued[job.id] = job
        bisect.insort(self.by_tenant.setdefault(job.tenant, []), job, key=ModelJob.order_key)

    def _pop(self, job_id: int) -> ModelJob:
        job = self.queued.pop(job_id)
        self.by_tenant[job.tenant].remove(job)
        return job

    # -- operations ----------------------------------------------------------------------
    def enqueue(self, job: ModelJob, now: float, weight: float = 1.0, max_running: int = 10) -> None:
        """Mirror of the ``enqueue`` statement for one job."""
        v = self.activation_vtime()
        t = self.tenants.get(job.tenant)
        due = job.run_at <= now
        if t is None:
            t = ModelTenant(job.tenant, weight, max_running, vtime=v, active=due,
                            wake_at=None if due else job.run_at)
            self.tenants[job.tenant] = t
        elif not t.active:
            if due:
                t.active, t.wake_at, t.vtime = True, None, v
            elif t.wake_at is None or job.run_at < t.wake_at:
                t.wake_at = job.run_at
        self._push(job)

    def wake_due(self, now: float) -> None:
        """Mirror of ``wake_due_tenants`` (maintenance)."""
        v = self.activation_vtime()
        for t in sorted(self.tenants.values(), key=lambda t: t.name):
            if not t.active and t.wake_at is not None and t.wake_at <= now:
                t.active, t.wake_at, t.vtime = True, None, v

    def claim(self, policy: Policy, batch: int, now: float) -> list[int]:
        """Mirror of the policy's claim statement; returns claimed job ids in claim order."""
        if policy.statement == "claim_fifo":
            return self._claim_fifo(batch, now)
        return self._claim_fair(policy, batch, now)

    def _claim_fifo(self, batch: int, now: float) -> list[int]:
        open_tenants = {t.name for t in self.tenants.values() if t.running < t.max_running}
        picked = sorted(
            (j for j in self.queued.values() if j.run_at <= now and j.tenant in open_tenants),
            key=ModelJob.order_key,
        )[:batch]
        claimed: list[int] = []
        for j in picked:
            t = self.tenants[j.tenant]
            if t.running < t.max_running:
                t.running += 1
                claimed.append(j.id)
                self.running[j.id] = self._pop(j.id)
        return claimed

    def _claim_fair(self, policy: Policy, batch: int, now: float) -> list[int]:
        # claim_fair: the first `batch` runnable tenants; then, if short, claim_fair_wait over
        # up to tenant_scan tenants for the rest (with one claimer nothing is ever skipped).
        # After the waiting statement found what the first one could not, Store.claim starts
        # the next CONTENDED_CLAIMS claims with claim_fair_greedy; the model keeps the same counter.
        greedy = self.contended.get(policy.name, 0) > 0
        if greedy:
            self.contended[policy.name] -= 1
        claimed = self._fair_pass(policy, batch, now, scan=batch, empties_before_last=False,
                                  window=batch, greedy=greedy)
        if len(claimed) < batch:
            first = len(claimed)
            rest = batch - first
            claimed += self._fair_pass(policy, rest, now, scan=self.tenant_scan,
                                       empties_before_last=True, window=rest)
            if not claimed:
                claimed = self._fair_pass(policy, rest, now, scan=self.tenant_scan,
                                          empties_before_last=True, window=math.inf)
            if len(claimed) > first:
                self.contended[policy.name] = CONTENDED_CLAIMS
        return claimed

    def _fair_pass(self, policy: Policy, batch: int, now: float, *, scan: int,
                   empties_before_last: bool, window: float, greedy: bool = False) -> list[int]:
        """One claim statement. ``greedy`` (claim_fair_greedy): each tenant may give the rest of
        the batch instead of its weighted share, and tenants that gave nothing stay active."""
        by_weight = dict(policy.params)["by_weight"]
        vnow = self.virtual_now()
        cand = sorted((t for t in self._runnable() if vnow is not None and t.vtime <= vnow + window),
                      key=lambda t: (t.vtime, t.name))[:scan]
        total = sum((t.weight if by_weight else 1.0) for t in cand[:batch])
        picked: list[tuple[int, ModelTenant, ModelJob]] = []
        for ord_, t in enumerate(cand, start=1):
            if len(picked) >= batch:
                break
            share = batch if greedy else math.ceil(batch * (t.weight if by_weight else 1.0) / total)
            limit = min(t.max_running - t.running, batch, share)
            for j in self._due(t.name, now, limit):
                if len(picked) >= batch:
                    break
                picked.append((ord_, t, j))
        last = max((o for o, _, _ in picked), default=scan + 1) if empties_before_last else scan + 1
        served = {t.name for _, t, _ in picked}
        empties = [] if greedy else [
            t for o, t in enumerate(cand, start=1)
            if o < last and t.name not in served and not self._due(t.name, now, 1)
        ]
        claimed: list[int] = []
        for _, t, j in picked:
            t.running += 1
            claimed.append(j.id)
            self.running[j.id] = self._pop(j.id)
        # vtime moves by the sum of increments (the SQL sums per tenant, then adds once).
        for t in {t.name: t for _, t, _ in picked}.values():
            t.vtime += sum(policy.increment(cost=j.cost, weight=t.weight)
                           for _, tt, j in picked if tt is t)
        for t in empties:
            t.active = False
            pending = [j.run_at for j in self.by_tenant.get(t.name, [])]
            t.wake_at = min(pending) if pending else None
        return claimed

    def finish(self, job_id: int) -> None:
        """A running job ends (done, failed for good, or cancelled while running)."""
        job = self.running.pop(job_id)
        self.tenants[job.tenant].running -= 1

    def retry(self, job_id: int, run_at: float) -> None:
        """A running job failed and waits until ``run_at``; mirror of ``finish_failed``."""
        job = self.running.pop(job_id)
        t = self.tenants[job.tenant]
        t.running -= 1
        job.run_at = run_at
        self._push(job)
        if not t.active and (t.wake_at is None or run_at < t.wake_at):
            t.wake_at = run_at

    def set_tenant(self, tenant: str, weight: float, max_running: int) -> None:
        if tenant in self.tenants:
            self.tenants[tenant].weight = weight
            self.tenants[tenant].max_running = max_running
