"""No-op drain and bulk enqueue: fairq worker processes against PgQueuer, in one run.

    .venv/bin/python -m benchmarks.drain_vs_peers [--jobs 20000] [--repeats 2] [--policies fifo,weighted]

fairq runs once per policy in ``--policies`` (default ``fifo``, the baseline, and ``weighted``,
fairq's default policy), every policy on the same configurations; tenant defaults are weight 1
and no cap (``max_running`` 100,000), so a policy only changes the order jobs are claimed in.
PgQueuer comes with the bench extra: ``.venv/bin/pip install -e '.[bench]'`` (or just
``pgqueuer==1.6.0 asyncpg==0.32.0``, the pins in pyproject.toml).

Each round makes a fresh database, enqueues ``--jobs`` no-op jobs over 10 tenants with each
queue's batch API (jobs/s of that enqueue is the enqueue figure), then drains them:

* ``defaults``: fairq 1 worker process with its defaults (8 slots, batch up to the free slots,
  at most 10); PgQueuer 1 process with its default batch (10).
* ``batch32``: 2 processes each, batch 32: fairq 32 slots, PgQueuer batch 32.
* ``tuned``: 2 processes each, batch 500 (the brief's tuned PgQueuer). fairq never claims more
  jobs than it has free slots, so its batch of 500 takes 500 slots.

Drain time is read from each queue's own database timestamps, from the first claim to the
last completion (fairq: min(started_at) .. max(finished_at); PgQueuer: its harness's release ..
last ``successful`` log row), so process start-up is left out of both. fairq and PgQueuer
alternate within a repeat (the queues, fairq's policies among them, rotate one place each
repeat); the table reports medians and each fairq policy's ratio to PgQueuer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

import fairq
from fairq import migrate
from fairq.bench.peers import pgqueuer_bench
from fairq.policies import POLICIES
from tests.support.db import create_database, drop_database, dsn_for_db

REPO = Path(__file__).resolve().parents[1]
CONFIGS = {
    "defaults": {"processes": 1, "fairq": {"concurrency": 8, "batch": None}, "pgq_batch": 10},
    "batch32": {"processes": 2, "fairq": {"concurrency": 32, "batch": 32}, "pgq_batch": 32},
    "tuned": {"processes": 2, "fairq": {"concurrency": 500, "batch": 500}, "pgq_batch": 500},
}


def fairq_round(admin: str, jobs: int, cfg: dict[str, Any], policy: str = "fifo") -> dict[str, float]:
    name = create_database(admin, "fairq_drainbench")
    dsn = dsn_for_db(admin, name)
    procs: list[subprocess.Popen[str]] = []
    try:
        migrate.upgrade(dsn, "fairq")
        with fairq.App(dsn) as app:
            app.tenants.apply({"defaults": {"weight": 1.0, "max_running": 100_000}})
            items = [(f"t{i % 10}", {}) for i in range(jobs)]  # built before the clock, as PgQueuer's
            t0 = time.perf_counter()
            app.enqueue_many("noop", items)
            enqueue_s = time.perf_counter() - t0
        args = [sys.executable, "-m", "tests.support.worker_proc", dsn, "--until-empty",
                "--policy", policy, "--concurrency", str(cfg["fairq"]["concurrency"])]
        if cfg["fairq"]["batch"]:
            args += ["--batch", str(cfg["fairq"]["batch"])]
        procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
                 for _ in range(cfg["processes"])]
        for p in procs:
            p.communicate(timeout=600)
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT count(*) FILTER (WHERE status = 'done'), "
                               "extract(epoch FROM max(finished_at) - min(started_at)) "
                               "FROM fairq.jobs").fetchone()
        assert row is not None
        done, seconds = int(row[0]), float(row[1])
        return {"enqueue_jobs_per_s": jobs / enqueue_s, "drain_jobs_per_s": done / seconds,
                "done": done}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        drop_database(admin, name)


def pgqueuer_round(admin: str, jobs: int, cfg: dict[str, Any]) -> dict[str, float]:
    name = create_database(admin, "pgq_drainbench")
    dsn = dsn_for_db(admin, name)
    try:
        pgqueuer_bench.install(dsn)
        # drain() enqueues its own backlog first with the batch API; that is the enqueue figure.
        res = pgqueuer_bench.drain(dsn, jobs, processes=cfg["processes"], batch_size=cfg["pgq_batch"],
                                   tenants=10)
        return {"enqueue_jobs_per_s": float(res["prefill_jobs_per_s"]),
                "drain_jobs_per_s": float(res["jobs_per_s"]), "done": float(res["done"])}
    finally:
        drop_database(admin, name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dsn", default=os.environ.get("FAIRQ_TEST_DSN",
                                                   "postgresql://postgres@127.0.0.1:5432/postgres"))
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--policies", default="fifo,weighted",
                   help="fairq policies to run, comma-separated (default fifo,weighted)")
    p.add_argument("--json")
    args = p.parse_args()
    policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    unknown = [x for x in policies if x not in POLICIES]
    if unknown or not policies:
        p.error(f"unknown policy {unknown}: choose from {', '.join(sorted(POLICIES))}")
    queues = [f"fairq/{x}" for x in policies] + ["pgqueuer"]
    # results[config][queue] = one dict per repeat; queue is "fairq/<policy>" or "pgqueuer"
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    for name, cfg in CONFIGS.items():
        results[name] = {who: [] for who in queues}
        for r in range(args.repeats):
            shift = r % len(queues)
            for who in queues[shift:] + queues[:shift]:
                if who == "pgqueuer":
                    res = pgqueuer_round(args.dsn, args.jobs, cfg)
                else:
                    res = fairq_round(args.dsn, args.jobs, cfg, policy=who.split("/", 1)[1])
                results[name][who].append(res)
                if res["done"] < args.jobs:
                    print(f"WARNING {name} rep={r} {who}: only {res['done']:.0f} of {args.jobs} "
                          "jobs done", file=sys.stderr)
                print(f"{name} rep={r} {who}: {json.dumps({k: round(v) for k, v in res.items()})}",
                      file=sys.stderr)
    print("| config | queue | drain jobs/s (median) | enqueue jobs/s (median) |")
    print("|---|---|---|---|")
    for name, per in results.items():
        med = {who: (statistics.median(x["drain_jobs_per_s"] for x in runs),
                     statistics.median(x["enqueue_jobs_per_s"] for x in runs)) for who, runs in per.items()}
        for who, (drain, enq) in med.items():
            print(f"| {name} | {who} | {drain:,.0f} | {enq:,.0f} |")
        for who in queues[:-1]:
            print(f"| {name} | {who} / PgQueuer | {med[who][0] / med['pgqueuer'][0]:.2f}x | "
                  f"{med[who][1] / med['pgqueuer'][1]:.2f}x |")
        if "fairq/fifo" in med:
            for who in queues[:-1]:
                if who != "fairq/fifo":
                    print(f"| {name} | {who} / fairq/fifo | "
                          f"{med[who][0] / med['fairq/fifo'][0]:.2f}x | |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
