"""The app the fail-over tests run as ``fairq worker tests.support.failover_app:app``.

One task, ``work`` (payload ``{"n": N, "ms": M}``: sleeps M ms). Every worker process appends
to ``$FAIRQ_FAILOVER_LOG/<pid>.events`` one line per event, with the producer's number ``n``
(job ids are not unique across a fail-over: the new primary may hand them out again), the
job's id, the claim's attempt and started_at, and ``time.monotonic_ns()`` (one clock for every
process of the machine):

    start N ID ATTEMPT STARTED_AT NS     the handler began
    end N ID ATTEMPT STARTED_AT NS       the handler returned
    done N ID ATTEMPT STARTED_AT NS      the worker's finish of it committed (its observer)
    lost N ID ATTEMPT STARTED_AT NS      its finish was refused: the claim is no longer current
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import fairq
from fairq.models import ClaimedJob
from fairq.observe import NullObserver

_lock = threading.Lock()


def record(kind: str, job: ClaimedJob | fairq.Job) -> None:
    attempt = job.attempts
    line = (f"{kind} {job.payload['n']} {job.id} {attempt} {job.started_at.isoformat()} "
            f"{time.monotonic_ns()}\n")
    path = Path(os.environ["FAIRQ_FAILOVER_LOG"]) / f"{os.getpid()}.events"
    with _lock, path.open("a") as f:
        f.write(line)


class Recorder(NullObserver):
    """Writes a ``done`` line for every finish the worker saw committed, a ``lost`` line for
    every finish the fence refused."""

    def on_finish(self, job: ClaimedJob, outcome: str, run_seconds: float) -> None:
        if outcome in ("done", "lease_lost"):
            record("done" if outcome == "done" else "lost", job)


class RecordingApp(fairq.App):
    """An App whose workers report their committed finishes to a ``Recorder``."""

    def worker(self, **options: Any) -> Any:
        options.setdefault("observer", Recorder())
        return super().worker(**options)


app = RecordingApp()


@app.task(name="work", lease=15, max_attempts=50)
def work(job: fairq.Job) -> None:
    record("start", job)
    time.sleep(float(job.payload.get("ms", 20)) / 1000.0)
    record("end", job)
