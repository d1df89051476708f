"""Fair claim throughput against fifo, in the same run, same batch size, same claimers.

    python -m benchmarks.claim_bench [--quick] [--private-cluster] [--dsn URL] [--json FILE]

N claimer threads, each with its own connection (a ``Store`` with one pooled connection and
psycopg's default auto-prepare), claim and ``finish_done`` like a worker. Every tenant count
has its own database holding its backlog and ``--finished`` finished jobs (default 1,000,000).
(One database with a queue per size is a trap: tenant names shared across queues skew the
statistics, and claim_fifo then sorts a few tenants' whole backlog each claim; the plan test
guards that case.) Rounds alternate the policies (rotating the order each repeat) so the machine's
drift hits every policy alike; figures are medians over repeats, and the ratio is taken
against fifo's median in the same run; the paired ratio is the median of each repeat's round
against fifo's round of the same repeat.

Reported per (tenants, policy): jobs/s, ratio to fifo, empty claims while work was runnable
(the backlog never runs dry during a round), how often a claim ran its second statement (the
wait for a held tenant), p50/p99 claim latency (all round trips),
and per claim statement the planning and execution time:
EXPLAIN ANALYZE samples of the prepared statement as custom and generic plan and, with
``--private-cluster`` (pg_stat_statements loaded, track_planning on), what the workers' own
executions cost. A second table compares throughput with plans forced custom vs generic.
Prints Markdown on stdout; ``--json`` writes everything.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from benchmarks import claim_plans as cp
from fairq import migrate
from fairq.policies import get_policy
from fairq.runtime.maintenance import DEFAULT_VACUUM_INTERVAL, MaintenanceSchedule, ScheduleVacuum
from fairq.store import Store
from fairq.store.planner import planner_options

POLICIES = ("fifo", "round_robin", "weighted", "drr")
# Substrings that tell the claim statements apart in pg_stat_statements' normalised text.
PGSS_MARKS = {
    "claim_fair": ".claim_fair(",
    "claim_fifo": "WHERE ts.queue = q.queue AND ts.tenant = q.tenant",
    "finish_done": "FROM done d",
}


class CountingStore(Store):
    """A Store that counts the statements its claims run: how often the second (wait) ran."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.used: Counter[str] = Counter()

    def _claim_rows(self, statement: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        self.used["wait" if params.get("wait") else statement] += 1
        return super()._claim_rows(statement, params)


@dataclass
class Round:
    policy: str
    jobs: int
    seconds: float
    claims: int
    empty: int
    fallbacks: int  # claims that ran the second statement (wait: the first found nothing)
    latencies_ms: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds else 0.0


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


# A policy name ending in RATED runs that policy with a rate limit on every tenant of the queue
# that never binds (the token bucket's cost alone): --rate-limits adds "weighted+rate".
RATED = "+rate"


def set_rate_limits(store: Store, queue: str, on: bool) -> None:
    """Every tenant of ``queue`` limited to 1,000,000 jobs/s (burst as many), or unlimited."""
    with store.cursor() as cur:  # a benchmark's own set-up, as the loader writes its rows
        cur.execute("UPDATE fairq.tenant_schedule SET rate = %(r)s, burst = %(b)s, tokens = NULL, "
                    "refilled_at = NULL WHERE queue = %(q)s",
                    {"r": 1e6 if on else None, "b": 1_000_000 if on else None, "q": queue})


# --control runs fifo a second time in every repeat under this name: two runs of one statement
# land this far apart on the machine, the yardstick for a fair policy's ratio near 0.9.
CONTROL = "fifo_control"


# A policy name ending in GROUPED runs that policy with the queue's tenants in two groups of
# weights 3 and 1 (every other tenant): --groups adds "weighted+groups".
GROUPED = "+groups"


def set_groups(store: Store, queue: str, on: bool) -> None:
    """The queue's tenants alternately in groups g3 (weight 3) and g1 (weight 1), or none."""
    with store.cursor() as cur:  # a benchmark's own set-up, as the loader writes its rows
        cur.execute("DELETE FROM fairq.group_schedule")
        cur.execute("DELETE FROM fairq.tenant_groups")
        if on:
            cur.execute("INSERT INTO fairq.tenant_groups (tenant_group, weight) "
                        "VALUES ('g3', 3.0), ('g1', 1.0)")
        cur.execute("UPDATE fairq.tenant_schedule ts SET tenant_group = CASE WHEN %(on)s THEN "
                    "CASE WHEN hashtext(ts.tenant) %% 2 = 0 THEN 'g3' ELSE 'g1' END END "
                    "WHERE ts.queue = %(q)s", {"on": on, "q": queue})


def run_round(stores: list[CountingStore], policy: str, queue: str, jobs: int, batch: int) -> Round:
    """Every store claims + finishes in its own thread until ``jobs`` jobs were claimed."""
    rated, grouped = policy.endswith(RATED), policy.endswith(GROUPED)
    pol = get_policy("fifo" if policy == CONTROL else policy.removesuffix(RATED).removesuffix(GROUPED))
    set_rate_limits(stores[0], queue, rated)
    set_groups(stores[0], queue, grouped)
    lock = threading.Lock()
    state = {"claimed": 0, "claims": 0, "empty": 0}
    lats: list[list[float]] = [[] for _ in stores]
    before = [s.used["wait"] for s in stores]
    start = threading.Barrier(len(stores) + 1)

    errors: list[BaseException] = []

    def work(i: int, store: CountingStore) -> None:
        start.wait()
        try:
            claim_loop(i, store)
        except BaseException as exc:  # a dead claimer must fail the run, not slow it down
            errors.append(exc)

    def claim_loop(i: int, store: CountingStore) -> None:
        while True:
            with lock:
                if state["claimed"] >= jobs:
                    return
            t0 = time.perf_counter()
            got = store.claim(pol, queue=queue, batch=batch, worker=f"bench-{i}")
            lats[i].append((time.perf_counter() - t0) * 1000)
            if got:
                store.finish_done([(j.id, j.attempts) for j in got])
            with lock:
                state["claims"] += 1
                state["claimed"] += len(got)
                state["empty"] += not got

    threads = [threading.Thread(target=work, args=(i, s), daemon=True) for i, s in enumerate(stores)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    fallbacks = sum(s.used["wait"] - b for s, b in zip(stores, before, strict=True))
    return Round(policy, state["claimed"], elapsed, state["claims"], state["empty"], fallbacks,
                 [x for li in lats for x in li])


@contextmanager
def claimers(dsn: str, n: int, plan_mode: str) -> Iterator[list[CountingStore]]:
    """``n`` stores of one connection each; ``plan_mode`` auto|custom|generic for their sessions."""
    url = dsn if plan_mode == "auto" else make_conninfo(
        dsn, options=f"-c plan_cache_mode=force_{plan_mode}_plan")
    stores = [CountingStore(url, cp.SCHEMA, min_size=1, max_size=1, application_name=f"claim_bench_{i}")
              for i in range(n)]
    try:
        for s in stores:
            s.pool.wait()
        yield stores
    finally:
        for s in stores:
            s.close()


def prepared_plans(stores: list[CountingStore]) -> dict[str, dict[str, int]]:
    """What the plan cache chose in the workers' sessions: generic vs custom plans per statement."""
    out: dict[str, dict[str, int]] = {}
    for s in stores:
        with s.pool.connection() as conn:
            for text, gen, cus in conn.execute(
                    "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"):
                name = next((k for k, m in PGSS_MARKS.items() if m in text), None)
                if name:
                    d = out.setdefault(name, {"generic": 0, "custom": 0})
                    d["generic"] += gen
                    d["custom"] += cus
    return out


def pgss_available(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        loaded = conn.execute("SHOW shared_preload_libraries").fetchone()
        if not loaded or "pg_stat_statements" not in str(loaded[0]):
            return False
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        return True


def pgss_reset(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")


def pgss_read(dsn: str) -> dict[str, dict[str, float]]:
    """Mean planning and execution time (ms) per statement, and how many plans were made."""
    out: dict[str, dict[str, float]] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT query, calls, plans, total_plan_time, total_exec_time "
                            "FROM pg_stat_statements WHERE calls > 0").fetchall()
    for query, calls, plans, plan_ms, exec_ms in rows:
        name = next((k for k, m in PGSS_MARKS.items() if m in query), None)
        if name is None or "EXPLAIN" in query.upper()[:20]:
            continue
        d = out.setdefault(name, {"calls": 0, "plans": 0, "plan_ms": 0.0, "exec_ms": 0.0})
        d["calls"] += calls
        d["plans"] += plans
        d["plan_ms"] += plan_ms
        d["exec_ms"] += exec_ms
    for d in out.values():
        d["plan_ms_per_call"] = d["plan_ms"] / d["calls"]
        d["exec_ms_per_call"] = d["exec_ms"] / d["calls"]
    return out


def explain_samples(dsn: str, batch: int, queue: str, samples: int) -> dict[str, dict[str, float]]:
    """Median planning/execution ms per claim statement and plan mode (EXPLAIN ANALYZE, rolled back)."""
    acc: dict[str, dict[str, list[float]]] = {}
    # The claimers' own session settings (JIT off among them: a JIT compile would be timed).
    with psycopg.connect(dsn, autocommit=True, options=planner_options()) as conn:
        for _ in range(samples):
            for label, policy, statement in cp.CASES:
                for mode, (_doc, s) in cp.explain_case(conn, statement, policy, batch=batch,
                                                       queue=queue).items():
                    d = acc.setdefault(f"{label} {mode}", {"plan": [], "exec": [], "buffers": []})
                    d["plan"].append(s.planning_ms)
                    d["exec"].append(s.execution_ms)
                    d["buffers"].append(s.buffers)
    return {k: {m: statistics.median(v) for m, v in d.items()} for k, d in acc.items()}


def summarise(rounds: list[Round]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for policy in dict.fromkeys(r.policy for r in rounds):  # as run (weighted+rate too)
        rs = [r for r in rounds if r.policy == policy]
        if not rs:
            continue
        lats = [x for r in rs for x in r.latencies_ms]
        claims = sum(r.claims for r in rs)
        out[policy] = {
            "jobs_per_s": statistics.median(r.rate for r in rs),
            "rates": [round(r.rate, 1) for r in rs],  # type: ignore[dict-item]
            "claims": claims,
            "empty_ratio": sum(r.empty for r in rs) / claims if claims else 0.0,
            "fallback_ratio": sum(r.fallbacks for r in rs) / claims if claims else 0.0,
            "p50_ms": pct(lats, 0.50),
            "p99_ms": pct(lats, 0.99),
        }
    fifo = out.get("fifo", {}).get("jobs_per_s")
    fifo_rates = [r.rate for r in rounds if r.policy == "fifo"]
    for policy, d in out.items():
        d["ratio"] = d["jobs_per_s"] / fifo if fifo else float("nan")
        # Paired: each repeat's round against fifo's round of the same repeat (the rounds of one
        # repeat run back to back, so the machine's slower minutes hit both), then the median.
        rates = [r.rate for r in rounds if r.policy == policy]
        pairs = [a / b for a, b in zip(rates, fifo_rates, strict=False) if b > 0]
        d["paired"] = statistics.median(pairs) if pairs else float("nan")
    return out


@contextmanager
def worker_maintenance(dsn: str, interval: float) -> Iterator[ScheduleVacuum | None]:
    """What every deployed worker runs beside its claims: ScheduleVacuum, through the same
    MaintenanceSchedule (one caller per interval), on its own connection. Without it the bench
    would measure a tenant_schedule no deployment has (dead index entries since the last
    autovacuum, a minute or more). ``interval`` <= 0: none. The other services are left out:
    the pruner would delete the finished jobs the bench is about, the reaper and wakers have
    nothing to do here."""
    if interval <= 0:
        yield None
        return
    store = Store(dsn, cp.SCHEMA, min_size=1, max_size=1, application_name="claim_bench_maint")
    service = ScheduleVacuum(store, interval)
    schedule = MaintenanceSchedule(store, [service])
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            schedule.run_due()
            stop.wait(max(0.0, schedule.next_due() - time.monotonic()))

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield service
    finally:
        stop.set()
        t.join()
        store.close()


def vacuum_schedule(dsn: str) -> None:
    """VACUUM tenant_schedule now (the --vacuum-schedule diagnostic, before each round)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM fairq.tenant_schedule")


def bench_size(dsn: str, tenants: int, policies: Sequence[str], args: argparse.Namespace,
               plan_mode: str, pgss: bool) -> dict[str, Any]:
    queue = f"q{tenants}"
    rounds: list[Round] = []
    pgss_by_policy: dict[str, dict[str, dict[str, float]]] = {}
    with claimers(dsn, args.workers, plan_mode) as stores, \
            worker_maintenance(dsn, args.vacuum_interval) as vacuum:
        for policy in policies:  # warm-up: past psycopg's prepare threshold and the plan cache's
            run_round(stores, policy, queue, args.warmup_jobs, args.batch)
        for rep in range(args.repeats):
            order = list(policies[rep % len(policies):]) + list(policies[:rep % len(policies)])
            for policy in order:
                if args.vacuum_schedule:
                    vacuum_schedule(dsn)
                if pgss:
                    pgss_reset(dsn)
                r = run_round(stores, policy, queue, args.jobs_per_round, args.batch)
                rounds.append(r)
                if pgss:
                    for name, d in pgss_read(dsn).items():
                        tot = pgss_by_policy.setdefault(policy, {}).setdefault(
                            name, {"calls": 0, "plans": 0, "plan_ms": 0.0, "exec_ms": 0.0})
                        for k in ("calls", "plans", "plan_ms", "exec_ms"):
                            tot[k] += d[k]
                print(f"  {plan_mode} tenants={tenants} rep={rep} {policy}: {r.rate:.0f} jobs/s "
                      f"claims={r.claims} empty={r.empty} waits={r.fallbacks}", file=sys.stderr)
        plans = prepared_plans(stores)
    for per in pgss_by_policy.values():
        for d in per.values():
            d["plan_ms_per_call"] = d["plan_ms"] / d["calls"] if d["calls"] else 0.0
            d["exec_ms_per_call"] = d["exec_ms"] / d["calls"] if d["calls"] else 0.0
    return {"tenants": tenants, "plan_mode": plan_mode, "policies": summarise(rounds),
            "schedule_vacuums": vacuum.vacuums if vacuum else 0,
            "plan_cache": plans, "pgss": pgss_by_policy}


def load_size(admin: str, tenants: int, jobs: int, finished: int) -> str:
    """A fresh database for one tenant count, with a backlog that outlasts all its rounds."""
    db = cp.create_db(admin)
    dsn = cp.with_db(admin, db)
    migrate.upgrade(dsn, cp.SCHEMA)
    cp.load(dsn, tenants=tenants, queued_per_tenant=max(1, math.ceil(jobs / tenants)),
            finished=finished, queue=f"q{tenants}")
    return db


def fmt(x: float, nd: int = 2) -> str:
    return "n/a" if x != x else f"{x:.{nd}f}"


def markdown(result: dict[str, Any]) -> str:
    lines = ["| tenants | policy | jobs/s (median) | x fifo | x fifo, paired | empty claims "
             "| second statements / claim | p50 ms | p99 ms | plans (generic/custom) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for size in result["main"]:
        for policy, d in size["policies"].items():
            stmt = "claim_fifo" if policy in ("fifo", CONTROL) else "claim_fair"
            pc = size["plan_cache"].get(stmt, {})
            lines.append(f"| {size['tenants']:,} | {policy} | {d['jobs_per_s']:.0f} | {fmt(d['ratio'])} | "
                         f"{fmt(d.get('paired', float('nan')))} | {d['empty_ratio']:.1%} | "
                         f"{fmt(d['fallback_ratio'])} | {fmt(d['p50_ms'])} | "
                         f"{fmt(d['p99_ms'])} | {pc.get('generic', 0)}/{pc.get('custom', 0)} |")
    lines += ["", "Forced plan modes (same run):", "",
              "| tenants | plan mode | policy | jobs/s | x fifo (same mode) | p50 ms | p99 ms |",
              "|---|---|---|---|---|---|---|"]
    for size in result["modes"]:
        for policy, d in size["policies"].items():
            lines.append(f"| {size['tenants']:,} | {size['plan_mode']} | {policy} | {d['jobs_per_s']:.0f} | "
                         f"{fmt(d['ratio'])} | {fmt(d['p50_ms'])} | {fmt(d['p99_ms'])} |")
    lines += ["", "EXPLAIN ANALYZE samples (median ms; shared buffers):", "",
              "| tenants | statement / policy | mode | planning ms | execution ms | buffers |",
              "|---|---|---|---|---|---|"]
    for n, cases in result["explain"].items():
        for key, d in cases.items():
            label, mode = key.rsplit(" ", 1)
            lines.append(f"| {int(n):,} | {label} | {mode} | {fmt(d['plan'])} | {fmt(d['exec'])} | "
                         f"{d['buffers']:.0f} |")
    if any(s["pgss"] for s in result["main"]):
        lines += ["", "pg_stat_statements, the workers' own executions (ms per call):", "",
                  "| tenants | policy | statement | calls | plans | planning | execution |",
                  "|---|---|---|---|---|---|---|"]
        for size in result["main"]:
            for policy, per in size["pgss"].items():
                for name, d in sorted(per.items()):
                    lines.append(f"| {size['tenants']:,} | {policy} | {name} | {d['calls']:.0f} | "
                                 f"{d['plans']:.0f} | {d['plan_ms_per_call']:.3f} | "
                                 f"{d['exec_ms_per_call']:.3f} |")
    return "\n".join(lines)


def verdict(result: dict[str, Any]) -> list[str]:
    """The issue's targets, each stated as met or not."""
    out = []
    worst = min((d["ratio"], s["tenants"], p) for s in result["main"]
                for p, d in s["policies"].items() if p not in ("fifo", CONTROL))
    out.append(f"every fair policy >= 0.9x fifo: {'MET' if worst[0] >= 0.9 else 'NOT MET'} "
               f"(worst {worst[0]:.2f}x: {worst[2]} at {worst[1]:,} tenants)")
    paired = min((d.get("paired", float("nan")), s["tenants"], p) for s in result["main"]
                 for p, d in s["policies"].items() if p not in ("fifo", CONTROL))
    out.append(f"  by paired ratios (each repeat against its own fifo round): worst "
               f"{paired[0]:.2f}x ({paired[2]} at {paired[1]:,} tenants)")
    control = [s["policies"][CONTROL]["ratio"] for s in result["main"] if CONTROL in s["policies"]]
    if control:
        out.append(f"noise: fifo run twice ({CONTROL}), its second run x its first: "
                   f"{min(control):.2f}x .. {max(control):.2f}x over the tenant counts")
    p99 = {s["tenants"]: max(d["p99_ms"] for p, d in s["policies"].items()
                             if p not in ("fifo", CONTROL))
           for s in result["main"]}
    if 10 in p99 and 100_000 in p99:
        ok = p99[100_000] <= 2 * p99[10]
        out.append(f"fair p99 at 100,000 tenants <= 2x at 10: {'MET' if ok else 'NOT MET'} "
                   f"({p99[100_000]:.2f} ms vs {p99[10]:.2f} ms)")
    empties = sum(d["empty_ratio"] for s in result["main"] for d in s["policies"].values())
    out.append(f"zero empty claims while work is runnable: {'MET' if empties == 0 else 'NOT MET'}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--dsn", default=os.environ.get("FAIRQ_DATABASE_URL") or cp.DEFAULT_DSN,
                    help="admin DSN; a fresh database is created beside it and dropped")
    ap.add_argument("--private-cluster", action="store_true",
                    help="run on a throwaway cluster with pg_stat_statements (fsync on, as the server)")
    ap.add_argument("--quick", action="store_true", help="short run: fewer jobs, repeats, finished jobs")
    ap.add_argument("--sizes", default="1,4,10,100,10000,100000")
    ap.add_argument("--mode-sizes", default="10,100000", help="sizes of the custom-vs-generic table")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--jobs-per-round", type=int, default=4000)
    ap.add_argument("--warmup-jobs", type=int, default=300)
    ap.add_argument("--finished", type=int, default=1_000_000)
    ap.add_argument("--explain-samples", type=int, default=5)
    ap.add_argument("--json", type=Path, help="write the full results here")
    ap.add_argument("--vacuum-interval", type=float, default=DEFAULT_VACUUM_INTERVAL,
                    help="seconds between the workers' VACUUM of tenant_schedule, emulated "
                         "beside the claimers as a worker runs it (default: the worker's; 0: none)")
    ap.add_argument("--control", action="store_true",
                    help=f"also run fifo a second time each repeat, as {CONTROL}: the noise")
    ap.add_argument("--rate-limits", action="store_true",
                    help="also run weighted with a (never binding) rate limit on every tenant")
    ap.add_argument("--groups", action="store_true",
                    help="also run weighted with the tenants in two groups (weights 3 and 1)")
    ap.add_argument("--vacuum-schedule", action="store_true",
                    help="diagnostic: also VACUUM tenant_schedule before each round")
    args = ap.parse_args(argv)
    if args.quick:
        args.repeats, args.jobs_per_round, args.warmup_jobs = 3, 500, 100
        args.finished, args.explain_samples = min(args.finished, 100_000), 2
    sizes = [int(x) for x in args.sizes.split(",")]
    mode_sizes = [int(x) for x in args.mode_sizes.split(",") if x and int(x) in sizes]

    cluster = None
    admin = args.dsn
    if args.private_cluster:
        from tests.support import pgcluster

        cluster = pgcluster.start(Path(tempfile.mkdtemp(prefix="claim_bench-")), options={
            "shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track_planning": "on",
            "fsync": "on", "synchronous_commit": "on", "full_page_writes": "on",
            "shared_buffers": "128MB"})
        admin = cluster.dsn
    dbs: dict[int, str] = {}
    try:
        per_size_jobs = ((len(POLICIES) + args.rate_limits + args.groups + args.control)
                         * (args.repeats * args.jobs_per_round + args.warmup_jobs)
                         + 2 * 2 * (args.repeats * args.jobs_per_round + args.warmup_jobs))
        result: dict[str, Any] = {
            "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "args": {k: str(v) for k, v in vars(args).items()},
            "uptime_before": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
            "main": [], "modes": [], "explain": {}}
        for n in sizes:
            t0 = time.perf_counter()
            dbs[n] = load_size(admin, n, int(per_size_jobs * 1.3) + 20 * args.batch, args.finished)
            dsn = cp.with_db(admin, dbs[n])
            print(f"tenants={n}: loaded in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
            pgss = result["pg_stat_statements"] = pgss_available(dsn)
            policies = (*POLICIES, *(("weighted" + RATED,) if args.rate_limits else ()),
                        *(("weighted" + GROUPED,) if args.groups else ()),
                        *((CONTROL,) if args.control else ()))
            result["main"].append(bench_size(dsn, n, policies, args, "auto", pgss))
            if n in mode_sizes:
                for mode in ("custom", "generic"):
                    result["modes"].append(bench_size(dsn, n, ("fifo", "weighted"), args, mode, False))
            result["explain"][str(n)] = explain_samples(dsn, args.batch, f"q{n}", args.explain_samples)
            cp.drop_db(admin, dbs.pop(n))
        result["uptime_after"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        result["verdict"] = verdict(result)
    finally:
        for db in dbs.values():
            cp.drop_db(admin, db)
        if cluster is not None:
            cluster.stop()
            cluster.remove()
    print(markdown(result))
    print()
    for line in result["verdict"]:
        print(f"- {line}")
    print(f"\nload: before {result['uptime_before']}; after {result['uptime_after']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=lambda o: asdict(o)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
