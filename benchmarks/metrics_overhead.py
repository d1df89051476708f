"""Overhead of worker metrics on claim throughput: the same claim/finish loop with the
PrometheusObserver (scraped every second, as in production) and without it, alternating rounds
in one run so drift in the machine or the database hits both sides alike.

    python -m benchmarks.metrics_overhead [--dsn URL] [--rounds 10] [--jobs-per-round 2000]

The database is a fresh one created next to ``--dsn`` (default ``$FAIRQ_DATABASE_URL`` or the
local test server) and dropped afterwards. Prints per-round throughput, the median of each side
and their ratio; exits 1 when the overhead exceeds ``--max-overhead`` (default 5%).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import threading
import time
from collections.abc import Sequence

import psycopg
from prometheus_client import generate_latest
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from fairq import migrate
from fairq.metrics import PrometheusObserver
from fairq.models import NewJob
from fairq.observe import NullObserver, WorkerObserver
from fairq.policies import get_policy
from fairq.store import Store

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


def with_db(dsn: str, name: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = name
    return make_conninfo(**params)  # type: ignore[arg-type]


def run_round(store: Store, observer: WorkerObserver, policy: str, jobs: int, batch: int
              ) -> tuple[float, float]:
    """Claim and finish ``jobs`` jobs the way a worker does.

    Returns (jobs per second, fraction of the round's time spent inside observer hooks).
    """
    pol = get_policy(policy)
    done = 0
    in_hooks = 0.0
    started = time.perf_counter()
    while done < jobs:
        t0 = time.perf_counter()
        claimed = store.claim(pol, queue="default", batch=batch, worker="bench")
        h0 = time.perf_counter()
        observer.on_claim("default", pol.name, "claimed" if claimed else "empty", h0 - t0, claimed)
        in_hooks += time.perf_counter() - h0
        if not claimed:
            break
        store.finish_done([(j.id, j.attempts) for j in claimed])
        h0 = time.perf_counter()
        for j in claimed:
            observer.on_finish(j, "done", 0.001)
        observer.on_loop(True)
        in_hooks += time.perf_counter() - h0
        done += len(claimed)
    elapsed = time.perf_counter() - started
    return done / elapsed, in_hooks / elapsed


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", default=os.environ.get("FAIRQ_DATABASE_URL") or DEFAULT_DSN)
    ap.add_argument("--rounds", type=int, default=10, help="rounds per side (default 10)")
    ap.add_argument("--jobs-per-round", type=int, default=2000)
    ap.add_argument("--tenants", type=int, default=200, help="tenants (more than the fold limit)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--policy", default="weighted")
    ap.add_argument("--max-overhead", type=float, default=0.05)
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)

    name = f"fairq_bench_metrics_{secrets.token_hex(4)}"
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    dsn = with_db(args.dsn, name)
    scraping = threading.Event()
    try:
        migrate.upgrade(dsn, "fairq")
        store = Store(dsn, "fairq", max_size=2)
        store.pool.wait()
        store.set_tenants([], defaults=(1.0, 1_000_000))  # no caps: measure claims, not waits
        # Twice what the rounds take: no tenant runs dry, every round claims the same way.
        total = 2 * (args.jobs_per_round * args.rounds * 2 + args.jobs_per_round)
        store.enqueue([NewJob(task="t", tenant=f"tenant{i % args.tenants:04d}", payload_json="{}")
                       for i in range(total)])
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE fairq.jobs")
        observer = PrometheusObserver()  # default max_tenants (50): most tenants fold
        null = NullObserver()

        def scrape() -> None:  # Prometheus scraping every second, as in production
            while not scraping.wait(1.0):
                generate_latest(observer.registry)

        threading.Thread(target=scrape, daemon=True).start()
        run_round(store, null, args.policy, args.jobs_per_round, args.batch)  # warm-up
        with_m: list[float] = []
        without: list[float] = []
        hook_share: list[float] = []
        for i in range(args.rounds):
            order = [(observer, with_m), (null, without)]
            for obs, out in order if i % 2 == 0 else order[::-1]:
                rate, share = run_round(store, obs, args.policy, args.jobs_per_round, args.batch)
                out.append(rate)
                if obs is observer:
                    hook_share.append(share)
        store.close()
    finally:
        scraping.set()
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                pgsql.Identifier(name)))

    med_with, med_without = statistics.median(with_m), statistics.median(without)
    # Adjacent rounds see the same database state: compare them pairwise.
    paired = statistics.median(w / wo for w, wo in zip(with_m, without, strict=True))
    overhead = 1.0 - paired
    result = {
        "policy": args.policy, "batch": args.batch, "tenants": args.tenants,
        "rounds_per_side": args.rounds, "jobs_per_round": args.jobs_per_round,
        "with_metrics_jobs_per_s": [round(x, 1) for x in with_m],
        "without_metrics_jobs_per_s": [round(x, 1) for x in without],
        "median_with": round(med_with, 1), "median_without": round(med_without, 1),
        "paired_median_ratio": round(paired, 4),
        "overhead": round(overhead, 4),
        "time_in_hooks": round(statistics.median(hook_share), 5),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key:28} {value}")
        verdict = "OK" if overhead < args.max_overhead else "OVER TARGET"
        print(f"overhead {overhead:+.2%} (target < {args.max_overhead:.0%}): {verdict}")
    return 0 if overhead < args.max_overhead else 1


if __name__ == "__main__":
    sys.exit(main())
