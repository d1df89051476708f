"""No-op drain and bulk enqueue: fairq worker processes against PgQueuer, in one run (issue 3).

    .venv/bin/python benchmarks/drain_vs_peers.py [--jobs 20000] [--repeats 2]

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
alternate within a repeat; the table reports medians and the fairq/PgQueuer ratio.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import psycopg  # noqa: E402
from conftest import create_database, drop_database, dsn_for_db  # noqa: E402

import fairq  # noqa: E402
from benchmarks.peers import pgqueuer_bench  # noqa: E402
from fairq import migrate  # noqa: E402

CONFIGS = {
    "defaults": {"processes": 1, "fairq": {"concurrency": 8, "batch": None}, "pgq_batch": 10},
    "batch32": {"processes": 2, "fairq": {"concurrency": 32, "batch": 32}, "pgq_batch": 32},
    "tuned": {"processes": 2, "fairq": {"concurrency": 500, "batch": 500}, "pgq_batch": 500},
}


def fairq_round(admin: str, jobs: int, cfg: dict[str, Any]) -> dict[str, float]:
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
        args = [sys.executable, str(REPO / "tests/helpers/worker_proc.py"), dsn, "--until-empty",
                "--policy", "fifo", "--concurrency", str(cfg["fairq"]["concurrency"])]
        if cfg["fairq"]["batch"]:
            args += ["--batch", str(cfg["fairq"]["batch"])]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
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
    p.add_argument("--json")
    args = p.parse_args()
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    for name, cfg in CONFIGS.items():
        results[name] = {"fairq": [], "pgqueuer": []}
        for r in range(args.repeats):
            order = ["fairq", "pgqueuer"] if r % 2 == 0 else ["pgqueuer", "fairq"]
            for who in order:
                fn = fairq_round if who == "fairq" else pgqueuer_round
                res = fn(args.dsn, args.jobs, cfg)
                results[name][who].append(res)
                print(f"{name} rep={r} {who}: {json.dumps({k: round(v) for k, v in res.items()})}",
                      file=sys.stderr)
    print("| config | queue | drain jobs/s (median) | enqueue jobs/s (median) |")
    print("|---|---|---|---|")
    for name, per in results.items():
        med = {who: (statistics.median(x["drain_jobs_per_s"] for x in runs),
                     statistics.median(x["enqueue_jobs_per_s"] for x in runs)) for who, runs in per.items()}
        for who, (drain, enq) in med.items():
            print(f"| {name} | {who} | {drain:,.0f} | {enq:,.0f} |")
        print(f"| {name} | fairq / PgQueuer | {med['fairq'][0] / med['pgqueuer'][0]:.2f}x | "
              f"{med['fairq'][1] / med['pgqueuer'][1]:.2f}x |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
