"""The benchmark scenarios: who enqueues what, when, with which weights, caps and workers.

Every scenario is deterministic (seeded), so runs under different policies see the same jobs.
``quick`` sizes keep ``fairq bench --quick`` under two minutes on a small machine; ``full``
sizes are a go-live checklist.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

BIG = "t0001"


def tenant(i: int) -> str:
    return f"t{i:04d}" if i < 10_000 else f"t{i}"


@dataclass(frozen=True)
class Arrivals:
    """Steady arrivals while workers drain: ``rate`` jobs a second for ``seconds``."""

    rate: float
    seconds: float
    tenants: tuple[str, ...]

    def per_tick(self, tick: float) -> int:
        return max(1, round(self.rate * tick))

    def total(self, tick: float = 0.05) -> int:
        return round(self.seconds / tick) * self.per_tick(tick)


@dataclass(frozen=True)
class Scenario:
    """One load shape. ``jobs`` are (tenant, delay seconds, fails first attempt) in enqueue order."""

    name: str
    about: str
    jobs: tuple[tuple[str, float, bool], ...]
    workers: int = 1
    slots: int = 8
    job_seconds: float = 0.0
    weights: dict[str, float] = field(default_factory=dict)
    caps: dict[str, int] = field(default_factory=dict)
    arrivals: Arrivals | None = None
    fail_share: float = 0.0
    groups: dict[str, str] = field(default_factory=dict)  # tenant -> group label, for plots

    def total_jobs(self) -> int:
        return len(self.jobs) + (self.arrivals.total() if self.arrivals else 0)

    def tenant_names(self) -> set[str]:
        names = {t for t, _, _ in self.jobs}
        if self.arrivals:
            names |= set(self.arrivals.tenants)
        return names | set(self.weights) | set(self.caps)

    def enqueue_groups(self) -> list[tuple[float, bool, list[str]]]:
        """Runs of consecutive jobs with the same (delay, fails): one ``enqueue_many`` each."""
        out: list[tuple[float, bool, list[str]]] = []
        for t, delay, fail in self.jobs:
            if out and out[-1][0] == delay and out[-1][1] == fail:
                out[-1][2].append(t)
            else:
                out.append((delay, fail, [t]))
        return out

    def group_of(self, tenant_name: str) -> str:
        return self.groups.get(tenant_name, tenant_name)


def noisy(scale: int = 1, *, name: str = "noisy", job_seconds: float = 0.01,
          workers: int = 1, slots: int = 8) -> Scenario:
    """Seed 004's shape: tenant 1 enqueues 1,000 x scale jobs first, then 10 x scale tenants 5 each."""
    big = [(BIG, 0.0, False)] * (1000 * scale)
    small = [(tenant(i), 0.0, False) for i in range(2, 10 * scale + 2) for _ in range(5)]
    groups = {tenant(i): "small" for i in range(2, 10 * scale + 2)} | {BIG: "big"}
    return Scenario(name, f"1 tenant x {1000 * scale:,} jobs, then {10 * scale:,} tenants x 5",
                    tuple(big + small), workers=workers, slots=slots, job_seconds=job_seconds,
                    groups=groups)


def zipf(n_tenants: int, n_jobs: int, s: float = 1.1, seed: int = 7) -> Scenario:
    """Jobs over tenants with Zipf-skewed volumes, shuffled arrival order."""
    rng = random.Random(seed)
    weights = [1.0 / (k ** s) for k in range(1, n_tenants + 1)]
    chosen = rng.choices(range(1, n_tenants + 1), weights=weights, k=n_jobs)
    groups = {tenant(k): ("top 10" if k <= 10 else "rest") for k in range(1, n_tenants + 1)}
    return Scenario("zipf", f"{n_jobs:,} jobs over {n_tenants:,} tenants, Zipf s={s}",
                    tuple((tenant(k), 0.0, False) for k in chosen), workers=2, slots=8,
                    groups=groups)


def many_tenants(n_tenants: int, per_tenant: int = 2) -> Scenario:
    jobs = tuple((tenant(i), 0.0, False) for i in range(1, n_tenants + 1) for _ in range(per_tenant))
    return Scenario("many_tenants", f"{n_tenants:,} tenants x {per_tenant} jobs", jobs,
                    workers=2, slots=8, groups=dict.fromkeys({t for t, _, _ in jobs}, "all"))


def hot_tenant(n_jobs: int, workers: int = 6, slots: int = 4) -> Scenario:
    """the hot spot: every worker contends for one tenant's row (its cap raised out of the way)."""
    return Scenario("hot_tenant", f"1 tenant x {n_jobs:,} jobs, {workers} workers x {slots} slots",
                    tuple((BIG, 0.0, False) for _ in range(n_jobs)), workers=workers, slots=slots,
                    caps={BIG: 100_000})


def caps(n_tenants: int, per_tenant: int, cap: int = 2) -> Scenario:
    """More slots than the caps allow in total: caps must hold while slots go idle."""
    jobs = tuple((tenant(i), 0.0, False) for _ in range(per_tenant) for i in range(1, n_tenants + 1))
    return Scenario("caps", f"{n_tenants} tenants x {per_tenant}, cap {cap}, 4 x 8 slots", jobs,
                    workers=4, slots=8, job_seconds=0.005,
                    caps={tenant(i): cap for i in range(1, n_tenants + 1)})


def tiers(backlog: int, rate: float, seconds: float) -> Scenario:
    """Gold 4 / silver 2 / free 1 with a backlog and a producer at ``rate`` jobs/s on top."""
    names = {"gold": [tenant(1), tenant(2)], "silver": [tenant(3), tenant(4)],
             "free": [tenant(i) for i in range(5, 9)]}
    w = {"gold": 4.0, "silver": 2.0, "free": 1.0}
    weights = {t: w[g] for g, ts in names.items() for t in ts}
    groups = {t: g for g, ts in names.items() for t in ts}
    every = [t for ts in names.values() for t in ts]
    jobs = tuple((t, 0.0, False) for t in every for _ in range(backlog))
    return Scenario("tiers", f"gold 4 / silver 2 / free 1, {backlog} each + {rate:g} jobs/s "
                    f"for {seconds:g} s", jobs, workers=1, slots=8, job_seconds=0.005,
                    weights=weights, arrivals=Arrivals(rate, seconds, tuple(every)), groups=groups)


def retry_mix(n_tenants: int, per_tenant: int, seed: int = 11) -> Scenario:
    """30% of jobs delayed 0.5..2 s, 20% fail their first attempt and retry after 0.2 s."""
    rng = random.Random(seed)
    jobs = []
    for _ in range(per_tenant):
        for i in range(1, n_tenants + 1):
            delay = rng.choice((0.5, 1.0, 2.0)) if rng.random() < 0.3 else 0.0
            jobs.append((tenant(i), delay, rng.random() < 0.2))
    return Scenario("retry_mix", f"{n_tenants} tenants x {per_tenant}, 30% delayed, 20% fail once",
                    tuple(jobs), workers=2, slots=8, job_seconds=0.002, fail_share=0.2)


def drain(n_jobs: int, n_tenants: int = 10) -> Scenario:
    """No-op jobs over a few tenants: raw claim-and-finish throughput."""
    return Scenario("drain", f"{n_jobs:,} no-op jobs over {n_tenants} tenants, 2 x 8 slots",
                    tuple((tenant(1 + k % n_tenants), 0.0, False) for k in range(n_jobs)),
                    workers=2, slots=8)


QUICK: dict[str, Callable[[], Scenario]] = {
    "noisy": lambda: noisy(1),
    "noisy_100x": lambda: noisy(2, name="noisy_100x", job_seconds=0.0, workers=2),
    "zipf": lambda: zipf(1000, 1_000),
    "many_tenants": lambda: many_tenants(1_000),
    "hot_tenant": lambda: hot_tenant(400),
    "caps": lambda: caps(8, 10),
    "tiers": lambda: tiers(20, 200.0, 1.5),
    "retry_mix": lambda: retry_mix(10, 10),
    "drain": lambda: drain(1_000),
}

FULL: dict[str, Callable[[], Scenario]] = {
    "noisy": lambda: noisy(1),
    "noisy_100x": lambda: noisy(100, name="noisy_100x", job_seconds=0.0, workers=2),
    "zipf": lambda: zipf(1000, 20_000),
    "many_tenants": lambda: many_tenants(100_000),
    "hot_tenant": lambda: hot_tenant(10_000),
    "caps": lambda: caps(10, 100),
    "tiers": lambda: tiers(200, 600.0, 10.0),
    "retry_mix": lambda: retry_mix(50, 40),
    "drain": lambda: drain(20_000),
}

def tiny() -> Scenario:
    """For the test: 60 jobs of one tenant, then 5 tenants x 3, 4 slots (a second or two). The
    big tenant's cap is raised out of the way: at the default cap (10) its running jobs and its
    slots given back but not yet folded (decision 014) can reach it on a loaded machine, and
    fifo then serves the small tenants early (grant less, never more): not what it shows."""
    jobs = [(BIG, 0.0, False)] * 60 + [(tenant(i), 0.0, False) for i in range(2, 7) for _ in range(3)]
    return Scenario("tiny", "1 tenant x 60 jobs, then 5 tenants x 3", tuple(jobs), slots=4,
                    groups={BIG: "big"} | {tenant(i): "small" for i in range(2, 7)},
                    caps={BIG: 100_000})


TINY: dict[str, Callable[[], Scenario]] = {"tiny": tiny}
