"""Scaling across worker processes on one PostgreSQL: 1, 2 and 4 `fairq worker` processes.

    .venv/bin/python -m benchmarks.scaling [--processes 1,2,4] [--slots 8] [--jobs 10000]
        [--shapes spread,hot] [--policy weighted] [--workers default,before] [--job-ms 0]
        [--dsn URL]

Each (shape, processes) run gets a fresh database with ``--jobs`` no-op jobs queued (``spread``:
over 100 tenants; ``hot``: one tenant), no cap in reach, then starts that many
``fairq worker benchmarks.drain_matrix:app --concurrency SLOTS --until-empty`` processes at once.
Measured: jobs per second from the first job's start to the last one's finish (database clock);
the CPU time of the database's backends per 1,000 jobs (from /proc, so the server must run on
this machine; sampled every 20 ms, a backend's last 20 ms may be missed); and the share of the
active sessions' samples (``pg_stat_activity``, every 20 ms) that waited on a lock.
``--workers default,before`` runs each case twice, in turn: the worker at its defaults, and
without claiming ahead and with a batch of 10 (``--claim-ahead 0 --batch 10``). ``--job-ms M``
makes each job's handler sleep M ms (a handler waiting on I/O): the processes' slots, not the
machine's cores, then bound the rate, so whether a tenant's claims queue on each other shows
as throughput that does or does not grow with the processes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import psycopg

from benchmarks import claim_cpu as cc
from benchmarks import drain_matrix as dm
from fairq import migrate
from tests.support.db import create_database, drop_database, dsn_for_db

ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
FAIRQ = Path(sys.executable).with_name("fairq")
REPO = Path(__file__).resolve().parent.parent


BEFORE = ["--claim-ahead", "0", "--batch", "10"]


def run(dsn: str, shape: str, processes: int, args: argparse.Namespace,
        worker: str = "default") -> dict[str, float]:
    tenants = 1 if shape == "hot" else 100
    with dm.build_app(dsn) as a:
        a.tenants.apply({"defaults": {"weight": 1.0, "max_running": 100_000}})
        payload = {"ms": args.job_ms} if args.job_ms else {}
        a.enqueue_many(dm.TASK, [(f"t{i % tenants}", payload) for i in range(args.jobs)])
    stop = threading.Event()
    cpu: dict[int, float] = {}
    samples = {"active": 0, "lock": 0}

    def sampler() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            while not stop.is_set():
                for pid, state, wtype in c.execute(
                        "SELECT pid, state, wait_event_type FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"):
                    with contextlib.suppress(OSError):  # the backend just ended
                        cpu[pid] = cc.proc_cpu(pid) / cc.HZ
                    if state == "active":
                        samples["active"] += 1
                        samples["lock"] += wtype == "Lock"
                stop.wait(0.02)

    env = {**os.environ, "FAIRQ_DATABASE_URL": dsn, "FAIRQ_SCHEMA": dm.SCHEMA}
    th = threading.Thread(target=sampler)
    th.start()
    try:
        procs = [subprocess.Popen(
            [str(FAIRQ), "worker", "benchmarks.drain_matrix:app", "--concurrency",
             str(args.slots), "--until-empty", "--policy", args.policy,
             *(BEFORE if worker == "before" else [])],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(processes)]
        for p in procs:
            p.wait(timeout=600)
    finally:
        stop.set()
        th.join()
    with psycopg.connect(dsn) as c:
        row = c.execute(f"SELECT count(*) FILTER (WHERE status = 'done'), "
                        f"extract(epoch FROM max(finished_at) - min(started_at)) "
                        f"FROM {dm.SCHEMA}.jobs").fetchone()
    assert row is not None
    done, seconds = int(row[0]), float(row[1])
    return {"done": done, "rate": done / seconds, "cpu_ms_per_1000": sum(cpu.values()) * 1e6 / done,
            "lock_share": samples["lock"] / max(samples["active"], 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", default=ADMIN, help="admin DSN; each run gets its own database")
    ap.add_argument("--processes", default="1,2,4")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--shapes", default="spread,hot")
    ap.add_argument("--policy", default="weighted")
    ap.add_argument("--workers", default="default",
                    help="default, before (no claiming ahead, batch 10), or both: default,before")
    ap.add_argument("--job-ms", type=float, default=0.0,
                    help="each handler sleeps this long (default 0: no-op jobs)")
    args = ap.parse_args()
    if args.job_ms < 0:
        ap.error("--job-ms must be >= 0")
    workers = args.workers.split(",")
    if any(w not in ("default", "before") for w in workers):
        ap.error(f"--workers takes default and/or before, not {args.workers!r}")
    kind = f"jobs of {args.job_ms:g} ms" if args.job_ms else "no-op jobs"
    print(f"{args.jobs} {kind}, {args.slots} slots a process, {args.policy}; "
          f"{os.cpu_count()} cores")
    for shape in args.shapes.split(","):
        for n, worker in ((int(x), w) for x in args.processes.split(",") for w in workers):
            name = create_database(args.dsn, "fairq_scale")
            try:
                dsn = dsn_for_db(args.dsn, name)
                migrate.upgrade(dsn, dm.SCHEMA)
                r = run(dsn, shape, n, args, worker)
            finally:
                drop_database(args.dsn, name)
            print(f"{shape:7s} {n} process(es) {worker:7s}: {r['done']:.0f} jobs at "
                  f"{r['rate']:.0f} jobs/s; "
                  f"backends {r['cpu_ms_per_1000']:.0f} ms CPU per 1,000 jobs; "
                  f"{100 * r['lock_share']:.1f}% of active samples waiting on a lock", flush=True)


if __name__ == "__main__":
    main()
