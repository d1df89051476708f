"""From a run's raw observations to the figures of the report (pure functions)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from fairq.bench.recording import RunData
from fairq.bench.scenarios import Scenario
from fairq.policies.fairness import jain_index

PER_TENANT_LIMIT = 50  # per-tenant detail in the JSON for the tenants with the most jobs


def pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), -(-len(ordered) * q // 100)))
    return ordered[int(rank) - 1]


def ideal_allocation(capacity: float, demand: dict[str, float],
                     weights: dict[str, float]) -> dict[str, float]:
    """Weighted max-min fair shares of ``capacity`` (water filling): nobody gets more than it
    asked for, and what the satisfied leave is shared by weight among the rest."""
    alloc = dict.fromkeys(demand, 0.0)
    active = {t for t, d in demand.items() if d > 0}
    left = capacity
    while active and left > 1e-9:
        wsum = sum(weights.get(t, 1.0) for t in active)
        share = {t: left * weights.get(t, 1.0) / wsum for t in active}
        sat = {t for t in active if demand[t] - alloc[t] <= share[t]}
        if not sat:
            for t in active:
                alloc[t] += share[t]
            break
        for t in sat:
            left -= demand[t] - alloc[t]
            alloc[t] = demand[t]
        active -= sat
    return alloc


def fairness(data: RunData, sc: Scenario) -> tuple[float | None, float | None]:
    """Jain's index of served/ideal and max |served - ideal| / served, over the first half of the
    run's starts, against the weighted max-min fair allocation of the jobs due by then."""
    starts = sorted(e for _, e, _ in data.starts)
    if not starts:
        return None, None
    t_half = starts[(len(starts) - 1) // 2]
    served: dict[str, float] = defaultdict(float)
    for t, e, _ in data.starts:
        if e <= t_half:
            served[t] += 1
    demand: dict[str, float] = defaultdict(float)
    for t, due in data.due:
        if due <= t_half:
            demand[t] += 1
    capacity = sum(served.values())
    ideal = ideal_allocation(capacity, demand, sc.weights)
    ratios = [served.get(t, 0.0) / a for t, a in ideal.items() if a > 0]
    err = max(abs(served.get(t, 0.0) - a) for t, a in ideal.items()) / capacity if ideal else 0.0
    return jain_index(ratios), err


def share_over_time(data: RunData, sc: Scenario, buckets: int = 20) -> dict[str, Any]:
    """Share of starts per group in equal time buckets (for the plots)."""
    if not data.starts:
        return {"t": [], "groups": {}}
    lo = data.released
    hi = max(e for _, e, _ in data.starts) + 1e-6
    width = max((hi - lo) / buckets, 1e-6)
    counts: dict[str, list[int]] = defaultdict(lambda: [0] * buckets)
    for t, e, _ in data.starts:
        counts[sc.group_of(t) if sc.groups else "all"][min(buckets - 1, int((e - lo) / width))] += 1
    totals = [sum(c[i] for c in counts.values()) for i in range(buckets)]
    return {"t": [round((i + 0.5) * width, 3) for i in range(buckets)],
            "groups": {g: [c[i] / totals[i] if totals[i] else 0.0 for i in range(buckets)]
                       for g, c in sorted(counts.items())}}


def _censored(data: RunData) -> dict[str, list[float]]:
    """Jobs due but not started when a run hit its deadline: their wait so far (a lower bound),
    so that a policy that starves a tenant is not flattered by leaving its jobs out."""
    due: dict[str, list[float]] = defaultdict(list)
    for t, d in data.due:
        due[t].append(d)
    started: dict[str, int] = defaultdict(int)
    for t, _, _ in data.starts:
        started[t] += 1
    out: dict[str, list[float]] = {}
    for t, ds in due.items():
        rest = sorted(ds)[started.get(t, 0):]
        if rest:
            out[t] = [max(0.0, data.ended - d) for d in rest if d < data.ended]
    return out


def _thin(values: list[float], keep: int = 1000) -> list[float]:
    """At most ``keep`` evenly spaced values of a sorted list (plots need the shape only)."""
    if len(values) <= keep:
        return values
    return [values[round(i * (len(values) - 1) / (keep - 1))] for i in range(keep)]


def summarise(data: RunData, sc: Scenario) -> dict[str, Any]:
    """Every figure of one (scenario, policy) run."""
    by_tenant: dict[str, list[float]] = defaultdict(list)
    for t, _, w in data.starts:
        by_tenant[t].append(w)
    censored = _censored(data) if data.timed_out else {}
    for t, ws in censored.items():
        by_tenant[t].extend(ws)
    waits = [w for ws in by_tenant.values() for w in ws]
    tenant_p95 = [p for p in (pct(ws, 95) for ws in by_tenant.values()) if p is not None]
    group_waits: dict[str, list[float]] = defaultdict(list)
    for t, ws in by_tenant.items():
        group_waits[sc.group_of(t) if sc.groups else "all"].extend(ws)
    seconds = (data.ended - data.released) if data.ended > data.released else None
    claims_ms = [s * 1000 for s in data.claim_s]
    samples = len(data.lock_samples)
    jain, share_err = fairness(data, sc)
    top = sorted(by_tenant, key=lambda t: -len(by_tenant[t]))[:PER_TENANT_LIMIT]
    cap_violations = (sum(1 for t, cap in sc.caps.items() if data.max_running.get(t, 0) > cap)
                      if sc.caps else 0)
    return {
        "scenario": sc.name,
        "policy": data.policy,
        "expected_jobs": data.expected,
        "completed_jobs": data.completed,
        "timed_out": data.timed_out,
        "censored_waits": sum(len(ws) for ws in censored.values()),
        "seconds": seconds,
        "throughput_jobs_s": data.completed / seconds if seconds else None,
        "wait_p50_s": pct(waits, 50),
        "wait_p95_s": pct(waits, 95),
        "wait_p99_s": pct(waits, 99),
        "tenant_p95_median_s": statistics.median(tenant_p95) if tenant_p95 else None,
        "tenant_p95_max_s": max(tenant_p95) if tenant_p95 else None,
        "group_wait": {g: {"n": len(ws), "p50_s": pct(ws, 50), "p95_s": pct(ws, 95),
                           "p99_s": pct(ws, 99)} for g, ws in sorted(group_waits.items())},
        "per_tenant_wait": {t: {"n": len(by_tenant[t]), "p50_s": pct(by_tenant[t], 50),
                                "p95_s": pct(by_tenant[t], 95), "p99_s": pct(by_tenant[t], 99)}
                            for t in top},
        "tenant_p95_dist_s": _thin(sorted(tenant_p95)),
        "claims": len(claims_ms),
        "claim_p50_ms": pct(claims_ms, 50),
        "claim_p95_ms": pct(claims_ms, 95),
        "claim_p99_ms": pct(claims_ms, 99),
        "empty_claim_ratio": data.empty_claims / len(claims_ms) if claims_ms else None,
        "plan_samples": len(data.plan_ms),
        "plan_ms": statistics.mean(data.plan_ms) if data.plan_ms else None,
        "exec_ms": statistics.mean(data.exec_ms) if data.exec_ms else None,
        "lock_samples": samples,
        "lock_wait_share": (sum(1 for s in data.lock_samples if s[0] > 0) / samples
                            if samples else None),
        "lock_waiting_mean": (statistics.mean(s[0] for s in data.lock_samples)
                              if samples else None),
        "locks_not_granted_max": max((s[2] for s in data.lock_samples), default=0),
        "jain_index": jain,
        "max_share_error": share_err,
        "cap_violations": cap_violations,
        "max_running": ({t: data.max_running.get(t, 0) for t in sorted(sc.caps)} if sc.caps
                        else None),
        "share_over_time": share_over_time(data, sc),
        "notes": sorted(set(data.notes)),
    }
