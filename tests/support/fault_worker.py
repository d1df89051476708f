"""A worker process for the fault, chaos and clock tests.

Usage: fault_worker.py DSN --log-dir DIR [--concurrency N] [--policy P] [--poll S]
                       [--clock-skew SECONDS] [--listen-dsn DSN] [--prepare-threshold N|none]
                       [--queues Q1,Q2]
                       [--pooler] [--log-level LEVEL]

Tasks: ``work`` (payload ``{"ms": M}``: sleeps M ms) and ``hold`` (payload ``{"s": S}``: sleeps
S seconds, extending nothing itself). Every execution appends ``id attempt`` to
``DIR/<pid>.log`` when it starts, and ``id attempt done`` when its handler returns, so a test can
count executions per job across processes, including ones killed with SIGKILL; and, when it
returns, ``id attempt start end`` (wall clock) to ``DIR/<pid>.spans``, so a test can check that no
job ran twice at the same time (``fault_tools.overlaps``). ``--pooler``: the DSN is a
transaction-mode pooler's (``App(pooler=True)``).

``--clock-skew`` moves this process's wall clock (``time.time``, ``datetime.now``,
``datetime.utcnow``) by that many seconds before fairq is imported: fairq must use the database
clock for leases and run_at, so nothing it does may change. Prints ``READY`` once the loop runs,
and ``STATS ...`` (including database errors seen) when it stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any


def skew_clock(seconds: float) -> None:
    """Shift the wall clock of this process (monotonic clocks are left alone, as in reality)."""
    real_time = time.time
    real_time_ns = time.time_ns
    time.time = lambda: real_time() + seconds  # type: ignore[assignment]
    time.time_ns = lambda: real_time_ns() + int(seconds * 1e9)  # type: ignore[assignment]
    real_datetime = _dt.datetime

    class SkewedDatetime(real_datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:  # type: ignore[override]
            return real_datetime.now(tz) + _dt.timedelta(seconds=seconds)

        @classmethod
        def utcnow(cls) -> Any:  # type: ignore[override]
            return real_datetime.utcnow() + _dt.timedelta(seconds=seconds)

    _dt.datetime = SkewedDatetime  # type: ignore[misc]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("dsn")
    p.add_argument("--log-dir", required=True)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--policy", default="weighted")
    p.add_argument("--poll", type=float, default=1.0)
    p.add_argument("--clock-skew", type=float, default=0.0)
    p.add_argument("--listen-dsn", default=None)
    p.add_argument("--prepare-threshold", default="5")
    p.add_argument("--reap-interval", type=float, default=0.5)
    p.add_argument("--queues", default=None, help="comma-separated; default: the tasks' queue")
    p.add_argument("--pooler", action="store_true")
    p.add_argument("--log-level", default="WARNING")
    p.add_argument("--batch", type=int, default=None)
    a = p.parse_args()
    if a.clock_skew:
        skew_clock(a.clock_skew)
    import fairq  # after the clock is skewed: fairq sees only the wrong clock

    logging.basicConfig(level=getattr(logging, a.log_level), stream=sys.stderr)
    threshold = None if a.prepare_threshold == "none" else int(a.prepare_threshold)
    app = fairq.App(a.dsn, schema="fairq", listen_dsn=a.listen_dsn, prepare_threshold=threshold,
                    pooler=a.pooler)
    log_path = Path(a.log_dir) / f"{os.getpid()}.log"
    spans_path = Path(a.log_dir) / f"{os.getpid()}.spans"
    log_lock = threading.Lock()

    def record(line: str, path: Path = log_path) -> None:
        with log_lock, path.open("a") as f:
            f.write(line + "\n")
            f.flush()

    def run(job: fairq.Job, seconds: float) -> None:
        start = time.time()
        record(f"{job.id} {job.attempt}")
        time.sleep(seconds)
        record(f"{job.id} {job.attempt} done")
        record(f"{job.id} {job.attempt} {start:.6f} {time.time():.6f}", spans_path)

    @app.task(name="work", lease=5, max_attempts=20)
    def work(job: fairq.Job) -> None:
        run(job, float(job.payload.get("ms", 5)) / 1000.0)

    @app.task(name="hold", lease=3, max_attempts=20)
    def hold(job: fairq.Job) -> None:
        run(job, float(job.payload.get("s", 1.0)))

    worker = app.worker(concurrency=a.concurrency, policy=a.policy, poll_interval=a.poll,
                        reap_interval=a.reap_interval, grace_period=10.0, max_backoff=2.0,
                        queues=a.queues.split(",") if a.queues else None, batch=a.batch)

    def announce() -> None:
        worker.ready.wait()
        print("READY", worker.worker_id, flush=True)

    threading.Thread(target=announce, daemon=True).start()
    parent = os.getppid()

    def orphan_watch() -> None:  # a test that died (timeout) must not leave us running
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(3)

    threading.Thread(target=orphan_watch, daemon=True).start()
    worker.run()
    s = worker.stats
    print(f"STATS done={s.done} retry={s.retry} failed={s.failed} lease_lost={s.lease_lost} "
          f"db_errors={s.db_errors} claimed={s.claimed} released={s.released} "
          f"reconnects={worker.shared.outage.reconnects}", flush=True)
    app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
