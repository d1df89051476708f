"""What the exporter computes from one database read, in pure Python: which tenants and queues
keep their own series, Jain's index and the share error per queue, the groups' shares and the
waiting tenants by reason. Kept apart from the collector (fairq.metrics.exporter), which reads,
caches and serves."""

from __future__ import annotations

import math
from collections.abc import Sequence
from heapq import nsmallest
from typing import NamedTuple

from prometheus_client.core import GaugeMetricFamily, Metric

from fairq.metrics import OTHER
from fairq.models import WAIT_REASONS
from fairq.policies.fairness import jain_index, max_share_error


class TenantRow(NamedTuple):
    """One (queue, tenant) as ``exporter_tenants`` reads it (a tuple: the exporter builds one
    per tenant per refresh, 100,000 of them with as many tenants)."""

    queue: str
    tenant: str
    weight: float
    max_running: int
    running: int
    claimed_total: int
    queued: int
    runnable: int
    oldest_age: float
    rate: float | None = None      # jobs per second; None: no rate limit
    tokens: float | None = None    # its token bucket now
    throttled: bool = False        # asleep until its next token
    throttled_seconds: float = 0.0  # time spent with a due job and no token, so far
    tenant_group: str = "default"
    group_weight: float = 1.0
    # Backlogged: its weight times its group's factor over the queue's backlogged tenants of
    # the group, read from the database (effective_weight); None when not backlogged.
    effective_weight: float | None = None


def keep_tenants(rows: Sequence[TenantRow], limit: int) -> set[str]:
    """The tenants that keep their own series: half the slots by oldest wait, then by backlog.
    (The first few of each order are picked without sorting every tenant.)"""
    age: dict[str, float] = {}
    backlog: dict[str, tuple[int, int]] = {}
    for r in rows:
        t = r.tenant
        if t in backlog:
            age[t] = max(age[t], r.oldest_age)
            q, run = backlog[t]
            backlog[t] = (q + r.queued, run + r.running)
        else:
            age[t] = max(0.0, r.oldest_age)
            backlog[t] = (r.queued, r.running)
    if len(backlog) <= limit:
        return set(backlog)
    # Plain tuples, compared natively: a key function per tenant costs more than the heap.
    by_age = nsmallest(math.ceil(limit / 2), ((-a, t) for t, a in age.items() if a > 0))
    kept = {t for _, t in by_age}
    # At most len(kept) of the first `limit + len(kept)` by backlog are kept already.
    for *_, t in nsmallest(limit + len(kept),
                           ((-q, -run, -age[t], t) for t, (q, run) in backlog.items())):
        if len(kept) >= limit:
            break
        kept.add(t)
    return kept


def keep_queues(rows: Sequence[TenantRow], leases: dict[str, int], limit: int) -> set[str]:
    """The queues that keep their own series (the same limit as tenants): by backlog, then
    oldest wait; the others are summed into ``queue="__other__"``."""
    size: dict[str, tuple[int, float]] = {q: (n, 0.0) for q, n in leases.items()}
    for r in rows:
        n, age = size.get(r.queue, (0, 0.0))
        size[r.queue] = (n + r.queued + r.running, max(age, r.oldest_age))
    if len(size) <= limit:
        return set(size)
    return set(sorted(size, key=lambda q: (-size[q][0], -size[q][1], q))[:limit])


def by_queue(rows: Sequence[TenantRow]) -> dict[str, list[TenantRow]]:
    """The rows of each queue, queues in order: one pass, however many queues."""
    out: dict[str, list[TenantRow]] = {}
    for r in rows:
        out.setdefault(r.queue, []).append(r)
    return dict(sorted(out.items()))


def fairness(rows: Sequence[TenantRow], claims: dict[tuple[str, str], float],
             grouped: dict[str, list[TenantRow]] | None = None
             ) -> dict[str, tuple[float, float]]:
    """queue -> (Jain's index, max share error) over the queue's backlogged tenants (those
    with an effective weight). ``grouped``: ``by_queue(rows)``, when the caller has it."""
    out: dict[str, tuple[float, float]] = {}
    for queue, its in (by_queue(rows) if grouped is None else grouped).items():
        weights = {r.tenant: w for r in its if (w := r.effective_weight) is not None}
        service = {t: claims.get((queue, t), 0.0) for t in weights}
        values = [service[t] / weights[t] for t in service]
        out[queue] = (jain_index(values), max_share_error(service, weights))
    return out


def group_shares(rows: Sequence[TenantRow], claims: dict[tuple[str, str], float],
                 grouped: dict[str, list[TenantRow]] | None = None
                 ) -> dict[tuple[str, str], tuple[float, float]]:
    """(queue, group) -> (share of the window's claims, share of weight) over the groups with
    backlogged tenants. ``grouped``: ``by_queue(rows)``, when the caller has it."""
    out: dict[tuple[str, str], tuple[float, float]] = {}
    for queue, its in (by_queue(rows) if grouped is None else grouped).items():
        backlogged = [r for r in its if r.runnable > 0 and r.max_running > 0]
        gw = {r.tenant_group: r.group_weight for r in backlogged}
        served: dict[str, float] = {}
        for r in backlogged:
            served[r.tenant_group] = served.get(r.tenant_group, 0.0) + claims.get((queue, r.tenant), 0.0)
        total_w, total_s = sum(gw.values()), sum(served.values())
        for g in sorted(gw):
            out[(queue, g)] = (served[g] / total_s if total_s else 0.0, gw[g] / total_w)
    return out


def waiting_family(waiting: dict[tuple[str, str], int], queues: set[str]) -> Metric:
    """``fairq_tenants_waiting``: the tenants of each queue by the reason their next job has not
    started (docs/explain.md), every reason but no_jobs, 0 included so a series never vanishes.
    A queue outside ``queues`` (the kept ones) is summed into ``queue="__other__"``."""
    g = GaugeMetricFamily(
        "fairq_tenants_waiting",
        "Tenants with jobs by why their next job has not started (fairq tenants explain): "
        "running = all their jobs run, nothing waits.", labels=["queue", "reason"])
    counts: dict[tuple[str, str], int] = {}
    for q in {q for q, _ in waiting} | queues:
        for name in WAIT_REASONS:
            if name != "no_jobs":
                counts[(q if q in queues else OTHER, name)] = 0
    for (q, why), n in waiting.items():
        key = (q if q in queues else OTHER, why)
        counts[key] = counts.get(key, 0) + n
    for (q, why), n in sorted(counts.items()):
        g.add_metric([q, why], float(n))
    return g
