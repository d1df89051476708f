"""Leases: bounded (per task, per enqueue, per extension), reaped before a drain concludes, and
kept alive by heartbeats that a held lock cannot delay."""

from __future__ import annotations

import math
import os
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
from fairq.store import Store
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
    """kill -9 a worker while its 8 slots run jobs (lease 2 s), wait 3 s, drain 300 short jobs
    with `fairq worker --until-empty`: it exits 0 only once every job is done. The dead
    worker's leases expired but the shared reaper interval (one reap per 5 s across workers)
    has not come round yet: the drain reaps them itself before it concludes. The first worker's
    jobs take 30 s (an environment variable the task reads), so its slots are surely busy when
    it is killed: with 50 ms jobs it once finished them all between the look and the kill."""
    (tmp_path / "drain_tasks.py").write_text(
        "import os, time\n"
        "import fairq\n"
        "app = fairq.App()\n"
        "@app.task(name='short', lease=2)\n"
        "def short(job):\n"
        "    time.sleep(float(os.environ.get('DRAIN_TEST_JOB_SECONDS', '0.05')))\n"
    )
    with fairq.App(dsn) as app:
        app.task(lambda job: None, name="short", lease=2)  # the producer knows the lease
        app.enqueue_many("short", [(f"t{i % 10}", {}) for i in range(300)])
    cmd = [sys.executable, "-m", "fairq", "--dsn", dsn, "worker", "drain_tasks:app",
           "--concurrency", "8", "--log-level", "warning"]
    first = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL,
                             env={**os.environ, "DRAIN_TEST_JOB_SECONDS": "30"})
    try:
        deadline = time.monotonic() + 30
        while counts(dsn).get("running", 0) < 8:  # every slot busy, for 30 s
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.05)
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


def test_a_held_lock_costs_no_lease(app: fairq.App, dsn: str,
                                    caplog: pytest.LogCaptureFixture) -> None:
    """Another session holds LOCK TABLE tenant_schedule for 9 s while a job with a 1 s lease
    runs (and finishes) under it. The worker's claims and maintenance wait on their lock
    timeout; its heartbeats do not (their own thread and connection). Other workers' reapers,
    whose statements began at moments during the lock and proceed when it goes, find no expired
    lease: the job runs once. The log names the lock timeout as such."""
    attempts: list[int] = []
    locked = threading.Event()

    @app.task(name="long", lease=1, max_attempts=3)
    def long(job: fairq.Job) -> None:
        attempts.append(job.attempt)
        if job.attempt == 1:
            assert locked.wait(10)
            time.sleep(6)  # six leases long, all under the lock

    def other_reaper(delay: float) -> None:
        time.sleep(delay)
        store = Store(dsn, "fairq", lock_timeout_ms=60_000, min_size=1, max_size=1)
        try:
            reaped.append(store.reap_expired().total)
        finally:
            store.close()

    reaped: list[int] = []
    job_id = app.enqueue("long", tenant="a")
    worker = app.worker(concurrency=2, poll_interval=0.2, reap_interval=0.2, listen=False)
    runner = threading.Thread(target=worker.run, kwargs={"until_empty": True}, daemon=True)
    with caplog.at_level("WARNING", logger="fairq"):
        runner.start()
        deadline = time.monotonic() + 30
        while not attempts:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with psycopg.connect(dsn) as locker:
            locker.execute("LOCK TABLE fairq.tenant_schedule")
            locked.set()
            reapers = [threading.Thread(target=other_reaper, args=(d,)) for d in (2.5, 5, 7.5)]
            for r in reapers:
                r.start()
            time.sleep(9)
            locker.rollback()
        for r in reapers:
            r.join(timeout=30)
        runner.join(timeout=60)
    assert not runner.is_alive()
    assert reaped == [0, 0, 0]
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT status, attempts FROM fairq.jobs WHERE id = %s",
                         (job_id,)).fetchone() == ("done", 1)
    assert attempts == [1]
    assert "lock timeout" in caplog.text
    assert "database unavailable" not in caplog.text
