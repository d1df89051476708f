"""A worker or a producer process for the upgrade test, runnable with any release's fairq on
PYTHONPATH (it uses only the API 0.1.0 already had).

    upgrade_proc.py worker DSN LABEL       runs until SIGTERM; each run recorded in upgrade_runs
    upgrade_proc.py produce DSN TAG SECONDS [--set-caps]
                                           enqueues for SECONDS (a new tenant every 10 jobs),
                                           prints how many; --set-caps: tenants.set on the way
"""

from __future__ import annotations

import signal
import sys
import threading
import time

import psycopg

import fairq


def worker(dsn: str, label: str) -> None:
    app = fairq.App(dsn)
    local = threading.local()

    @app.task(name="rec", lease=30)
    def rec(job: fairq.Job) -> None:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = psycopg.connect(dsn, autocommit=True)
        started = time.time()
        time.sleep(0.02)
        conn.execute("INSERT INTO public.upgrade_runs (job_id, attempt, who, started, ended) "
                     "VALUES (%s, %s, %s, to_timestamp(%s), clock_timestamp())",
                     (job.id, job.attempt, label, started))

    w = app.worker(concurrency=4, poll_interval=0.2, grace_period=10)
    signal.signal(signal.SIGTERM, lambda *_: w.stop())
    print("READY", flush=True)
    w.run()
    app.close()


def produce(dsn: str, tag: str, seconds: float, set_caps: bool) -> None:
    app = fairq.App(dsn)
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        tenant = f"{tag}-new{n // 10}" if n % 10 == 0 else f"{tag}-{n % 7}"
        app.enqueue("rec", tenant=tenant)
        if set_caps and n % 25 == 5:
            app.tenants.set(tenant, max_running=2)
        n += 1
        time.sleep(0.004)
    app.close()
    print(n, flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker(sys.argv[2], sys.argv[3])
    else:
        produce(sys.argv[2], sys.argv[3], float(sys.argv[4]), "--set-caps" in sys.argv)
