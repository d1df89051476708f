"""Handler failures reach the log: one WARNING each with job id, tenant, task, attempt and the
error's first line, at most N per window, then one summary line."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace
from typing import cast

import pytest

import fairq
from fairq.job import Job
from fairq.runtime.failure_log import FailureLog


def fake_job(i: int) -> Job:
    """What the failure log reads of a job."""
    return cast(Job, SimpleNamespace(id=i, tenant="acme", attempt=2, task="reports.send",
                                     max_attempts=5))


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and r.name == "fairq.worker"]


def test_one_line_per_failure_then_a_summary(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    flog = FailureLog(limit=3, window=10.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="fairq.worker")
    for i in range(1, 11):
        flog.failed(fake_job(i), "ValueError: bad report 7\n  File x.py, line 3\n")
    lines = warnings(caplog)
    assert lines == [f"job {i} failed (tenant 'acme', task 'reports.send', attempt 2 of 5): "
                     "ValueError: bad report 7" for i in (1, 2, 3)]
    now[0] = 10.5  # the next window: the summary first, then the new failure
    flog.failed(fake_job(11), "KeyError: 'x'")
    lines = warnings(caplog)[3:]
    assert lines[0].startswith("7 more handler failure(s) not logged in the last 10s")
    assert lines[1].startswith("job 11 failed") and lines[1].endswith("KeyError: 'x'")
    assert len(lines) == 2


def test_the_summary_comes_without_a_further_failure(caplog: pytest.LogCaptureFixture) -> None:
    flog = FailureLog(limit=1, window=0.3)
    caplog.set_level(logging.WARNING, logger="fairq.worker")
    for i in range(5):
        flog.failed(fake_job(i + 1), "RuntimeError: down")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(warnings(caplog)) < 2:
        time.sleep(0.02)
    assert warnings(caplog)[1].startswith("4 more handler failure(s) not logged")


def test_worker_logs_each_handler_failure_once(dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    app = fairq.App(dsn)

    def broken(job: fairq.Job) -> None:
        raise ValueError(f"cannot render report {job.payload['n']}\nmore detail")

    app.task(name="render", max_attempts=1)(broken)
    ids = [app.enqueue("render", tenant="acme", payload={"n": n}) for n in range(3)]
    with fairq.App(dsn) as producer:  # an app that registers nothing enqueues any task name
        producer.enqueue("nosuchtask", tenant="globex", max_attempts=1)  # a failure too
    caplog.set_level(logging.DEBUG, logger="fairq")
    try:
        worker = app.worker(policy="fifo", listen=False)
        worker.failure_log = FailureLog(limit=2, window=60.0)
        worker.run(until_empty=True)
    finally:
        app.close()
    lines = [m for m in warnings(caplog) if " failed (" in m]
    assert len(lines) == 2  # the limit; the other two are counted
    expected = {f"job {i} failed (tenant 'acme', task 'render', attempt 1 of 1): "
                f"ValueError: cannot render report {n}" for n, i in enumerate(ids)}
    unknown = [m for m in lines if m not in expected]  # the order of the four is not fixed
    assert all("task 'nosuchtask'" in m and "unknown task 'nosuchtask'" in m for m in unknown)
    assert len(set(lines)) == 2
    worker.failure_log.flush()
    assert any(m.startswith("2 more handler failure(s) not logged") for m in warnings(caplog))
    assert worker.stats.failed == 4


def test_unknown_task_is_logged_with_its_name(dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    app = fairq.App(dsn)
    app.task(name="known")(lambda job: None)
    with fairq.App(dsn) as producer:
        job_id = producer.enqueue("ghost", tenant="t1")
    caplog.set_level(logging.WARNING, logger="fairq.worker")
    try:
        app.worker(policy="fifo", listen=False).run(until_empty=True)
    finally:
        app.close()
    lines = [m for m in warnings(caplog) if m.startswith(f"job {job_id} failed")]
    assert len(lines) == 1 and "task 'ghost'" in lines[0]
    assert "unknown task 'ghost': this worker knows known" in lines[0]
