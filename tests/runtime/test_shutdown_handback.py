"""A job interrupted by its worker's own graceful stop goes back to the queue without spending an
attempt (docs/deployment.md, "Stopping a worker: the drain"): a real `fairq worker` process, a
real SIGTERM, a job longer than the grace period.

Each run's handler writes a file as it starts (the test waits for that file, not for a fixed
time) and then sleeps for HANDBACK_SECONDS; the worker is stopped while it sleeps.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import fairq
from tests.support.paths import REPO

TASKS = """\
import os, time
from pathlib import Path
import fairq
app = fairq.App()
@app.task(name='long', lease=30)
def long(job):
    Path(os.environ['HANDBACK_MARK']).write_text(f'{job.id} {job.attempt}')
    time.sleep(float(os.environ['HANDBACK_SECONDS']))
"""
GRACE = 1.0
JOB_SECONDS = 10.0


@pytest.fixture
def app(dsn: str) -> Iterator[fairq.App]:
    a = fairq.App(dsn, schema="fairq")  # registers no task: any name may be enqueued
    yield a
    a.close()


def row(dsn: str, job_id: int) -> tuple[Any, ...]:
    with psycopg.connect(dsn, autocommit=True) as c:
        r = c.execute("SELECT j.status, j.attempts, j.last_error, j.locked_by, "
                      "fairq.tenant_running(ts) FROM fairq.jobs j "
                      "JOIN fairq.tenant_schedule ts ON (ts.queue, ts.tenant) = (j.queue, j.tenant) "
                      "WHERE j.id = %s", (job_id,)).fetchone()
    assert r is not None
    return tuple(r)


def worker(tmp_path: Path, dsn: str, mark: Path, seconds: float,
           *args: str) -> subprocess.Popen[str]:
    (tmp_path / "handback_tasks.py").write_text(TASKS)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HANDBACK_MARK": str(mark),
           "HANDBACK_SECONDS": str(seconds)}
    return subprocess.Popen(
        [sys.executable, "-m", "fairq", "--dsn", dsn, "worker", "handback_tasks:app",
         "--concurrency", "2", "--poll-interval", "0.2", "--grace-period", str(GRACE), *args],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def interrupt(tmp_path: Path, dsn: str, name: str) -> str:
    """Start a worker, SIGTERM it once its handler has started, and return its stderr. It must
    exit at the end of the grace period, long before the job would have finished."""
    mark = tmp_path / f"{name}.started"
    p = worker(tmp_path, dsn, mark, JOB_SECONDS)
    try:
        deadline = time.monotonic() + 60
        while not mark.exists():  # the handler writes it as it starts
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.02)
        stopped = time.monotonic()
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=JOB_SECONDS * 3)
        took = time.monotonic() - stopped
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, err
    assert took < JOB_SECONDS - 2, f"the worker waited for the job ({took:.1f}s)\n{err}"
    return err


def run_to_done(tmp_path: Path, dsn: str, job_id: int) -> tuple[Any, ...]:
    p = worker(tmp_path, dsn, tmp_path / "second.started", 0.0, "--until-empty")
    try:
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, err
    return row(dsn, job_id)


def test_interrupted_job_with_one_attempt_is_handed_back_and_runs_again(
        app: fairq.App, dsn: str, tmp_path: Path) -> None:
    job_id = app.enqueue("long", tenant="a", max_attempts=1)
    err = interrupt(tmp_path, dsn, "first")
    status, attempts, last_error, locked_by, running = row(dsn, job_id)
    assert (status, attempts, locked_by, running) == ("queued", 0, None, 0), (row(dsn, job_id), err)
    assert last_error.startswith("handed back: worker ") and "grace period of 1s" in last_error
    assert "handed back 1 running job(s)" in err
    # A second worker runs it to the end, as its first and only attempt.
    status, attempts, _, _, running = run_to_done(tmp_path, dsn, job_id)
    assert (status, attempts, running) == ("done", 1, 0)


def test_interrupted_job_with_attempts_left_keeps_its_attempts(
        app: fairq.App, dsn: str, tmp_path: Path) -> None:
    """A job that failed once already (attempts 1 of 3) is interrupted in its second attempt:
    it is queued with attempts 1 still, due at once (no retry backoff)."""
    job_id = app.enqueue("long", tenant="a", max_attempts=3)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("UPDATE fairq.jobs SET attempts = 1, last_error = 'ValueError: earlier' "
                  "WHERE id = %s", (job_id,))
    interrupt(tmp_path, dsn, "first")
    status, attempts, last_error, _, running = row(dsn, job_id)
    assert (status, attempts, running) == ("queued", 1, 0)
    assert last_error.startswith("handed back: ")
    with psycopg.connect(dsn, autocommit=True) as c:
        due = c.execute("SELECT run_at <= now() FROM fairq.jobs WHERE id = %s",
                        (job_id,)).fetchone()
    assert due == (True,)
    status, attempts, _, _, _ = run_to_done(tmp_path, dsn, job_id)
    assert (status, attempts) == ("done", 2)


def test_a_second_hand_back_in_a_row_spends_the_attempt(app: fairq.App, dsn: str,
                                                        tmp_path: Path) -> None:
    """The bound: a job interrupted by two stops in a row (nothing finished or failed it in
    between) has the second interrupted attempt counted, so a job every deploy kills cannot
    loop for ever. With max_attempts=1 that second stop fails it for good."""
    job_id = app.enqueue("long", tenant="a", max_attempts=1)
    interrupt(tmp_path, dsn, "first")
    assert row(dsn, job_id)[:2] == ("queued", 0)
    interrupt(tmp_path, dsn, "second")
    status, attempts, last_error, locked_by, running = row(dsn, job_id)
    assert (status, attempts, locked_by, running) == ("failed", 1, None, 0)
    assert last_error.startswith("handed back: ") and "attempt 1 of 1 counted" in last_error


def test_hand_back_is_fenced_and_charges_policy_time(app: fairq.App, dsn: str) -> None:
    """The statement itself: a stale (id, attempts) changes nothing; a job handed back gives its
    tenant's slot back, and under policy time the tenant is charged the seconds it ran (5 s
    against the claim's charge of 1 s: its virtual time moves by 4 at weight 1)."""
    from fairq.policies import get_policy
    from fairq.store import Store

    app.enqueue_many("long", [("a", {}), ("a", {})])
    store = Store(dsn, "fairq")
    try:
        (job,) = store.claim(get_policy("time"), queue="default", batch=1, worker="w")
        with psycopg.connect(dsn, autocommit=True) as c:
            before = c.execute("SELECT vtime FROM fairq.tenant_schedule WHERE tenant = 'a'"
                               ).fetchone()
        assert store.hand_back_running([(job.id, job.attempts + 1)], ["stale"], [5.0],
                                       started=[job.started_at]) == {}
        assert store.hand_back_running([(job.id, job.attempts)], ["w stopped"], [5.0],
                                       started=[job.started_at]) == {job.id: "handed_back"}
    finally:
        store.close()
    status, attempts, last_error, locked_by, running = row(dsn, job.id)
    assert (status, attempts, last_error, locked_by, running) == (
        "queued", 0, "handed back: w stopped", None, 0)
    with psycopg.connect(dsn, autocommit=True) as c:
        after = c.execute("SELECT vtime FROM fairq.tenant_schedule WHERE tenant = 'a'").fetchone()
    assert before is not None and after is not None
    assert after[0] == pytest.approx(before[0] + 4.0)
