"""Soak: many jobs over many tenants through several worker processes, watched over time.

    python -m benchmarks.soak --jobs 1000000 --tenants 10000 --workers 3
    python -m benchmarks.soak --jobs 100000 --tenants 10000 --workers 3   # scaled

A producer keeps a bounded backlog (enqueue_many in chunks), worker processes (this script with
``--worker``) run no-op jobs with the pruner on, and every ``--sample`` seconds the script
records throughput, the jobs table's heap and index sizes, n_dead_tup, autovacuum runs and
fairq sessions ``idle in transaction``. Results go to stdout as a markdown table (``--out``
appends them to a file). Uses its own throwaway database (dropped at the end) on the server of
``FAIRQ_TEST_DSN`` unless ``--dsn`` names one.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

SAMPLE = """
SELECT pg_relation_size('fairq.jobs') AS heap, pg_indexes_size('fairq.jobs') AS idx,
       s.n_live_tup, s.n_dead_tup, s.autovacuum_count,
       (SELECT count(*) FROM fairq.jobs WHERE status = 'queued') AS backlog,
       (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
          AND application_name LIKE 'fairq%%' AND state LIKE 'idle in transaction%%') AS iit,
       (SELECT coalesce(max(extract(epoch FROM now() - xact_start)), 0) FROM pg_stat_activity
          WHERE datname = current_database() AND application_name LIKE 'fairq%%'
          AND xact_start IS NOT NULL AND pid <> pg_backend_pid()) AS longest_xact
FROM pg_stat_user_tables s WHERE s.schemaname = 'fairq' AND s.relname = 'jobs'
"""


def worker_main(dsn: str, concurrency: int, prune_after: float) -> int:
    import fairq

    app = fairq.App(dsn)

    @app.task(name="noop", lease=60)
    def noop(job: fairq.Job) -> None:
        pass

    app.worker(concurrency=concurrency, poll_interval=1.0, prune_after=prune_after,
               prune_interval=5.0).run()
    return 0


def mb(n: float) -> str:
    return f"{n / 1e6:.1f}"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dsn")
    p.add_argument("--jobs", type=int, default=1_000_000)
    p.add_argument("--tenants", type=int, default=10_000)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--backlog", type=int, default=50_000, help="producer keeps at most this queued")
    p.add_argument("--prune-after", type=float, default=30.0)
    p.add_argument("--sample", type=float, default=15.0)
    p.add_argument("--out")
    p.add_argument("--private", action="store_true",
                   help="run on a private throwaway cluster (tests/support/pgcluster.py) with autovacuum "
                   "on and default settings, instead of FAIRQ_TEST_DSN's server")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker_main(a.dsn, a.concurrency, a.prune_after)

    import fairq
    from fairq import migrate

    own_db = None
    dsn = a.dsn
    admin = os.environ.get("FAIRQ_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
    cluster = None
    if a.private:
        import tempfile

        from tests.support import pgcluster

        cluster = pgcluster.start(Path(tempfile.mkdtemp(prefix="fq-soak-")),
                                  options={"autovacuum": "on", "max_connections": "100"})
        admin = cluster.dsn
    if dsn is None:
        own_db = f"fairq_soak_{secrets.token_hex(4)}"
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(own_db)))
        params = conninfo_to_dict(admin)
        params["dbname"] = own_db
        dsn = make_conninfo(**params)  # type: ignore[arg-type]
    procs: list[subprocess.Popen[bytes]] = []
    rows: list[list[Any]] = []
    try:
        migrate.upgrade(dsn, "fairq")
        app = fairq.App(dsn)
        produced = 0
        stop = threading.Event()

        def produce() -> None:
            nonlocal produced
            with psycopg.connect(dsn, autocommit=True) as c:
                while produced < a.jobs and not stop.is_set():
                    backlog = c.execute("SELECT count(*) FROM fairq.jobs "
                                        "WHERE status = 'queued'").fetchone()[0]  # type: ignore[index]
                    if backlog > a.backlog:
                        time.sleep(0.5)
                        continue
                    n = min(5000, a.jobs - produced)
                    app.enqueue_many("noop", [(f"tenant-{(produced + i) * 7919 % a.tenants}", {})
                                              for i in range(n)])
                    produced += n

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        for _ in range(a.workers):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "benchmarks.soak", "--worker", "--dsn", dsn, "--concurrency",
                 str(a.concurrency), "--prune-after", str(a.prune_after)]))
        t0 = time.monotonic()
        done_total = 0
        last_t, last_done = t0, 0
        # done = produced - queued - running (the pruner deletes finished rows as we go)
        with psycopg.connect(dsn, autocommit=True) as mon:
            while True:
                time.sleep(a.sample)
                r = mon.execute(SAMPLE).fetchone()
                assert r is not None
                heap, idx, live, dead, av, backlog, iit, longest = r
                running = mon.execute("SELECT count(*) FROM fairq.jobs WHERE status = "
                                      "'running'").fetchone()[0]  # type: ignore[index]
                done_total = produced - backlog - running
                now = time.monotonic()
                rate = (done_total - last_done) / (now - last_t)
                last_t, last_done = now, done_total
                row = [f"{now - t0:.0f}", done_total, f"{rate:.0f}", backlog, live, dead, av,
                       mb(heap), mb(idx), iit, f"{float(longest):.2f}"]
                rows.append(row)
                print(" | ".join(map(str, row)), flush=True)
                if produced >= a.jobs and backlog == 0 and running == 0:
                    break
        elapsed = time.monotonic() - t0
        stop.set()
        app.close()
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if own_db:
            with psycopg.connect(admin, autocommit=True) as c:
                c.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    pgsql.Identifier(own_db)))
        if cluster is not None:
            cluster.remove()
    header = ("| t (s) | done | jobs/s (interval) | backlog | n_live_tup | n_dead_tup | "
              "autovacuums | jobs heap MB | jobs indexes MB | fairq idle in tx | longest fairq "
              "tx (s) |\n|" + "---|" * 11)
    table = header + "\n" + "\n".join("| " + " | ".join(map(str, r)) + " |" for r in rows)
    where = "a private PostgreSQL cluster (autovacuum on)" if a.private else admin.split("@")[-1]
    summary = (f"\nOn {where}: {a.jobs} jobs over {a.tenants} tenants, {a.workers} worker processes x "
               f"{a.concurrency} slots, prune_after={a.prune_after:g}s: {elapsed:.0f}s, "
               f"{a.jobs / elapsed:.0f} jobs/s overall; load average "
               f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")
    print(table + summary)
    if a.out:
        with Path(a.out).open("a") as f:
            f.write(table + "\n" + summary + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
