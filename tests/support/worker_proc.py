"""A tiny worker process for the lifecycle tests (kill -9, SIGTERM) and the throughput figure.

Usage: worker_proc.py DSN [--concurrency N] [--policy P] [--until-empty] [--grace S]
Tasks: ``noop``; ``timed`` (payload ``{"seconds": S}``: sleeps S and returns the seconds it
ran, as the handler measured them); ``sleepy`` (payload
``{"seconds": S, "mark": PATH, "sleep_attempts": [1]}``: writes PATH.started.N, sleeps on the
listed attempts (all by default), then writes PATH.done.N).
Prints ``READY`` once its loop runs and LISTEN is in effect.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import signal
import sys
import time
from pathlib import Path

import fairq


def build_app(dsn: str) -> fairq.App:
    app = fairq.App(dsn, schema="fairq")

    @app.task(name="noop", lease=30)
    def noop(job: fairq.Job) -> None:
        pass

    @app.task(name="timed", lease=30)
    def timed(job: fairq.Job) -> float:
        t0 = time.perf_counter()
        time.sleep(float(job.payload["seconds"]))
        return time.perf_counter() - t0

    @app.task(name="sleepy", lease=2, max_attempts=5)
    def sleepy(job: fairq.Job) -> None:
        mark = job.payload.get("mark")
        if mark:
            Path(f"{mark}.started.{job.attempt}").write_text(str(job.attempt))
        if job.attempt in job.payload.get("sleep_attempts", [job.attempt]):
            time.sleep(float(job.payload.get("seconds", 1.0)))
        if mark:
            Path(f"{mark}.done.{job.attempt}").write_text(str(job.attempt))

    return app


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("dsn")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--policy", default="fifo")
    p.add_argument("--until-empty", action="store_true")
    p.add_argument("--grace", type=float, default=30.0)
    p.add_argument("--poll", type=float, default=5.0)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--claim-ahead", type=int, default=None)
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # The signal lines ("signal 15: stopping ...") are what the signal tests wait for.
    logging.getLogger("fairq.worker").setLevel(logging.INFO)
    # a hung worker's threads can be dumped to stderr: kill -USR1 PID (the tests do on timeout)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    app = build_app(a.dsn)
    worker = app.worker(concurrency=a.concurrency, policy=a.policy, grace_period=a.grace,
                        poll_interval=a.poll, batch=a.batch, reap_interval=0.5,
                        claim_ahead=a.claim_ahead)

    import threading

    said = threading.Lock()
    announced: list[bool] = []

    def announce() -> None:
        worker.ready.wait()
        with said:
            if not announced:
                announced.append(True)
                print("READY", worker.worker_id, flush=True)

    threading.Thread(target=announce, daemon=True).start()
    t0 = time.perf_counter()
    worker.run(until_empty=a.until_empty)
    elapsed = time.perf_counter() - t0
    with said:  # a drain can be over before LISTEN was in effect: its loop ran all the same
        if not announced:
            announced.append(True)
            print("READY", worker.worker_id, flush=True)
    s = worker.stats
    print(f"STATS done={s.done} retry={s.retry} failed={s.failed} lease_lost={s.lease_lost} "
          f"released={s.released} abandoned={s.abandoned} seconds={elapsed:.3f}", flush=True)
    app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
