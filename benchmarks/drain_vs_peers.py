"""No-op drain and bulk enqueue: fairq worker processes against PgQueuer and awa-pg, in one run.

    .venv/bin/python -m benchmarks.drain_vs_peers [--jobs 20000] [--repeats 2]
        [--policies fifo,weighted] [--configs defaults,slots32,batch32,tuned] [--before]

fairq runs once per policy in ``--policies`` (default ``fifo``, the baseline, and ``weighted``,
fairq's default policy), every policy on the same configurations; tenant defaults are weight 1
and no cap (``max_running`` 100,000), so a policy only changes the order jobs are claimed in.
``--before`` adds each policy without claiming ahead and with the old default batch of 10
(``fairq/<policy>/ahead0``). PgQueuer comes with the bench extra: ``.venv/bin/pip install -e
'.[bench]'`` (or just ``pgqueuer==1.6.0 asyncpg==0.32.0``, the pins in pyproject.toml); awa-pg
with ``.venv/bin/pip install awa-pg`` (a binary wheel; without it awa-pg is left out, saying so).

Each round makes a fresh database, enqueues ``--jobs`` no-op jobs over 10 tenants with each
queue's batch API (jobs/s of that enqueue is the enqueue figure), then drains them:

* ``defaults``: fairq 1 worker process with its defaults (8 slots; a claim takes up to twice the
  slots, into the free slots and as many jobs ahead of them); PgQueuer 1 process with its
  default batch (10); awa-pg 1 process with 8 workers.
* ``slots32``: 1 process each: fairq 32 slots (default batch), PgQueuer batch 32, awa-pg 32
  workers.
* ``batch32``: 2 processes each, batch 32: fairq 32 slots, PgQueuer batch 32 (no awa-pg).
* ``tuned``: 2 processes each, batch 500 (the brief's tuned PgQueuer; no awa-pg). fairq claims
  into its free slots and as many ahead, so its batch of 500 takes 500 slots.

Drain time is read from each queue's own timestamps, from the first claim to the last
completion (fairq: min(started_at) .. max(finished_at); PgQueuer: its harness's release .. last
``successful`` log row; awa-pg: its first handler call .. its last, in the process), so process
start-up is left out. The whole-process figure is what a user waits for: jobs done over the
time from starting the worker processes to their exit (fairq and PgQueuer; awa-pg has none: its
harness runs in this process). The queues alternate within a repeat (they rotate one place each
repeat); the table reports medians and each fairq queue's ratio to each peer.
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
from fairq.bench.peers import awa_bench, pgqueuer_bench
from fairq.policies import POLICIES
from tests.support.db import create_database, drop_database, dsn_for_db

REPO = Path(__file__).resolve().parents[1]
CONFIGS: dict[str, dict[str, Any]] = {
    "defaults": {"processes": 1, "fairq": {"concurrency": 8, "batch": None}, "pgq_batch": 10,
                 "awa_workers": 8},
    "slots32": {"processes": 1, "fairq": {"concurrency": 32, "batch": None}, "pgq_batch": 32,
                "awa_workers": 32},
    "batch32": {"processes": 2, "fairq": {"concurrency": 32, "batch": 32}, "pgq_batch": 32},
    "tuned": {"processes": 2, "fairq": {"concurrency": 500, "batch": 500}, "pgq_batch": 500},
}
BEFORE = ["--claim-ahead", "0", "--batch", "10"]  # the worker without claiming ahead


def fairq_round(admin: str, jobs: int, cfg: dict[str, Any], policy: str = "fifo",
                extra: list[str] | None = None) -> dict[str, float]:
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
        args += extra or []
        whole_t0 = time.perf_counter()  # the processes' start to their exit: what a user waits
        procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
                 for _ in range(cfg["processes"])]
        for p in procs:
            p.communicate(timeout=600)
        whole_s = time.perf_counter() - whole_t0
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT count(*) FILTER (WHERE status = 'done'), "
                               "extract(epoch FROM max(finished_at) - min(started_at)) "
                               "FROM fairq.jobs").fetchone()
        assert row is not None
        done, seconds = int(row[0]), float(row[1])
        return {"enqueue_jobs_per_s": jobs / enqueue_s, "drain_jobs_per_s": done / seconds,
                "whole_jobs_per_s": done / whole_s, "done": done}
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
                "drain_jobs_per_s": float(res["jobs_per_s"]),
                "whole_jobs_per_s": float(res["done"]) / float(res["whole_s"]),
                "done": float(res["done"])}
    finally:
        drop_database(admin, name)


def awa_round(admin: str, jobs: int, cfg: dict[str, Any]) -> dict[str, float]:
    name = create_database(admin, "awa_drainbench")
    try:
        res = awa_bench.drain(dsn_for_db(admin, name), jobs, workers=cfg["awa_workers"])
        return {"enqueue_jobs_per_s": float(res["enqueue_jobs_per_s"]),
                "drain_jobs_per_s": float(res["jobs_per_s"]), "done": float(res["done"])}
    finally:
        drop_database(admin, name)


def run_queue(who: str, admin: str, jobs: int, cfg: dict[str, Any]) -> dict[str, float]:
    """One round of ``who``: "pgqueuer", "awa-pg", "fairq/<policy>" or "fairq/<policy>/ahead0"."""
    if who == "pgqueuer":
        return pgqueuer_round(admin, jobs, cfg)
    if who == "awa-pg":
        return awa_round(admin, jobs, cfg)
    _, policy, *before = who.split("/")
    return fairq_round(admin, jobs, cfg, policy=policy, extra=BEFORE if before else None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dsn", default=os.environ.get("FAIRQ_TEST_DSN",
                                                   "postgresql://postgres@127.0.0.1:5432/postgres"))
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--policies", default="fifo,weighted",
                   help="fairq policies to run, comma-separated (default fifo,weighted)")
    p.add_argument("--configs", default=",".join(CONFIGS),
                   help=f"configurations to run, comma-separated (default {','.join(CONFIGS)})")
    p.add_argument("--before", action="store_true",
                   help="also run each policy without claiming ahead, batch 10")
    p.add_argument("--json")
    args = p.parse_args()
    policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    unknown = [x for x in policies if x not in POLICIES]
    if unknown or not policies:
        p.error(f"unknown policy {unknown}: choose from {', '.join(sorted(POLICIES))}")
    configs = [x.strip() for x in args.configs.split(",") if x.strip()]
    if not configs or any(x not in CONFIGS for x in configs):
        p.error(f"unknown configuration in {configs}: choose from {', '.join(CONFIGS)}")
    fairq_queues = [f"fairq/{x}" for x in policies]
    if args.before:
        fairq_queues += [f"fairq/{x}/ahead0" for x in policies]
    awa = awa_bench.available()
    if awa is None:
        print("awa-pg is not installed (`.venv/bin/pip install awa-pg`): left out",
              file=sys.stderr)
    # results[config][queue] = one dict per repeat
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    for name in configs:
        cfg = CONFIGS[name]
        peers = ["pgqueuer"] + (["awa-pg"] if awa and cfg.get("awa_workers") else [])
        queues = fairq_queues + peers
        results[name] = {who: [] for who in queues}
        for r in range(args.repeats):
            shift = r % len(queues)
            for who in queues[shift:] + queues[:shift]:
                res = run_queue(who, args.dsn, args.jobs, cfg)
                results[name][who].append(res)
                if res["done"] < args.jobs:
                    print(f"WARNING {name} rep={r} {who}: only {res['done']:.0f} of {args.jobs} "
                          "jobs done", file=sys.stderr)
                print(f"{name} rep={r} {who}: {json.dumps({k: round(v) for k, v in res.items()})}",
                      file=sys.stderr)
    print("| config | queue | drain jobs/s (median) | whole-process jobs/s (median) | "
          "enqueue jobs/s (median) |")
    print("|---|---|---|---|---|")
    keys = ("drain_jobs_per_s", "whole_jobs_per_s", "enqueue_jobs_per_s")
    for name, per in results.items():
        med = {who: [statistics.median(x.get(k, float("nan")) for x in runs) for k in keys]
               for who, runs in per.items()}
        for who, (drain, whole, enq) in med.items():
            print(f"| {name} | {who} | {drain:,.0f} | {whole:,.0f} | {enq:,.0f} |")
        ours = [who for who in med if who.startswith("fairq/")]
        for peer in (x for x in med if not x.startswith("fairq/")):
            for who in ours:
                ratios = " | ".join(f"{a / b:.2f}x" for a, b in zip(med[who], med[peer], strict=True))
                print(f"| {name} | {who} / {peer} | {ratios} |")
        if "fairq/fifo" in med:
            for who in ours:
                if who != "fairq/fifo":
                    print(f"| {name} | {who} / fairq/fifo | "
                          f"{med[who][0] / med['fairq/fifo'][0]:.2f}x | "
                          f"{med[who][1] / med['fairq/fifo'][1]:.2f}x | |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
