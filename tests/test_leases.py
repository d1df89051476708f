"""Leases: bounded (per task, per enqueue, per extension), reaped before a drain concludes, and
kept alive by heartbeats that a held lock cannot delay."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import fairq
from fairq.validation import MAX_LEASE_SECONDS


@pytest.fixture
def app(dsn: str) -> Iterator[fairq.App]:
    a = fairq.App(dsn, schema="fairq")
    yield a
    a.close()


def lease_end(dsn: str, job_id: int) -> Any:
    with psycopg.connect(dsn) as c:
        row = c.execute("SELECT locked_until - now() FROM fairq.jobs WHERE id = %s",
                        (job_id,)).fetchone()
    assert row is not None
    return row[0]


def test_lease_bounds_per_task_and_enqueue(app: fairq.App) -> None:
    app.task(lambda job: None, name="ok", lease=MAX_LEASE_SECONDS)
    with pytest.raises(fairq.InvalidInput, match="lease"):
        app.task(lambda job: None, name="long", lease=MAX_LEASE_SECONDS + 1)
    app.enqueue("ok", tenant="a", lease=MAX_LEASE_SECONDS)
    with pytest.raises(fairq.InvalidInput, match=f"between 1 and {MAX_LEASE_SECONDS}"):
        app.enqueue("ok", tenant="a", lease=MAX_LEASE_SECONDS + 1)


@pytest.mark.parametrize("seconds", [1e11, 1e12, MAX_LEASE_SECONDS + 1, math.inf, math.nan, 0,
                                     -5, True, "60"])
def test_extend_lease_beyond_the_maximum_is_refused(app: fairq.App, dsn: str,
                                                    seconds: Any) -> None:
    outcome: dict[str, Any] = {}
    extended = threading.Event()

    @app.task(name="t", lease=30)
    def t(job: fairq.Job) -> None:
        before = lease_end(dsn, job.id)
        try:
            job.extend_lease(seconds)
        except fairq.InvalidInput as e:
            outcome["error"] = str(e)
        outcome["unchanged"] = lease_end(dsn, job.id).total_seconds() <= before.total_seconds()
        job.extend_lease(MAX_LEASE_SECONDS)  # the maximum itself is fine
        outcome["max"] = lease_end(dsn, job.id).total_seconds()
        extended.set()

    app.enqueue("t", tenant="a")
    app.worker(concurrency=1, listen=False, poll_interval=0.2).run(until_empty=True)
    assert extended.is_set()
    assert "lease extension must be" in outcome["error"]
    assert outcome["unchanged"]
    assert MAX_LEASE_SECONDS - 60 < outcome["max"] <= MAX_LEASE_SECONDS


def counts(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as c:
        return dict(c.execute("SELECT status, count(*) FROM fairq.jobs GROUP BY 1").fetchall())


def test_drain_after_kill_9_finishes_every_job(dsn: str, tmp_path: Path) -> None:
    """kill -9 a worker running 300 short jobs (lease 2 s) a second after it started, wait 3 s,
    drain with `fairq worker --until-empty`: it exits 0 only once every job is done. The dead
    worker's leases expired but the shared reaper interval (one reap per 5 s across workers)
    has not come round yet: the drain reaps them itself before it concludes."""
    (tmp_path / "drain_tasks.py").write_text(
        "import time\n"
        "import fairq\n"
        "app = fairq.App()\n"
        "@app.task(name='short', lease=2)\n"
        "def short(job):\n"
        "    time.sleep(0.05)\n"
    )
    with fairq.App(dsn) as app:
        app.task(lambda job: None, name="short", lease=2)  # the producer knows the lease
        app.enqueue_many("short", [(f"t{i % 10}", {}) for i in range(300)])
    cmd = [sys.executable, "-m", "fairq", "--dsn", dsn, "worker", "drain_tasks:app",
           "--concurrency", "8", "--log-level", "warning"]
    first = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while counts(dsn).get("done", 0) < 20:  # it is working
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.05)
        time.sleep(0.3)
    finally:
        first.kill()  # SIGKILL: no finish, no hand-back
        first.wait(timeout=10)
    stranded = counts(dsn).get("running", 0)
    assert stranded > 0, "the kill left nothing running: the test proves nothing"
    time.sleep(3)  # the leases expire
    drain = subprocess.run([*cmd, "--until-empty"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120)
    assert drain.returncode == 0, drain.stderr
    assert counts(dsn) == {"done": 300}, (stranded, drain.stderr)
