"""No-op drain throughput of one worker process, for comparing with peers.

Usage: .venv/bin/python -m tests.support.worker_drain CONCURRENCY [JOBS] [POLICY]
Creates a scratch database on $FAIRQ_TEST_DSN's server (dropped afterwards), enqueues JOBS
no-op jobs over 10 tenants, runs ``worker_proc.py --until-empty`` and prints jobs/s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import fairq
from fairq import migrate
from tests.support.db import create_database, drop_database, dsn_for_db
from tests.support.paths import REPO, SUPPORT


def main() -> None:
    admin = os.environ.get("FAIRQ_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
    conc = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 20_000
    policy = sys.argv[3] if len(sys.argv) > 3 else "fifo"
    name = create_database(admin, "fairq_drain")
    dsn = dsn_for_db(admin, name)
    try:
        migrate.upgrade(dsn, "fairq")
        with fairq.App(dsn) as app:
            t0 = time.perf_counter()
            app.enqueue_many("noop", [(f"t{i % 10}", {}) for i in range(n)])
            print(f"enqueue_many {n}: {n / (time.perf_counter() - t0):.0f} jobs/s")
        out = subprocess.run(
            [sys.executable, str(SUPPORT / "worker_proc.py"), dsn, "--until-empty",
             "--concurrency", conc, "--policy", policy],
            capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        stats = next(line for line in out.stdout.splitlines() if line.startswith("STATS"))
        secs = float(stats.split("seconds=")[1])
        print(f"concurrency={conc} policy={policy}: {stats} -> {n / secs:.0f} jobs/s")
    finally:
        drop_database(admin, name)


if __name__ == "__main__":
    main()
