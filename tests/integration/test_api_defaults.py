"""No default limits a worker silently: the default cap is said at start and settable from
Python; a task enqueues many at once; the queue's depth is one call."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import psycopg
import pytest

import fairq
from fairq.app import QueueDepth
from tests.support.db import SCHEMA


@pytest.fixture
def app(dsn: str) -> Iterator[fairq.App]:
    a = fairq.App(dsn, schema=SCHEMA)
    yield a
    a.close()


def test_set_defaults_from_python(app: fairq.App) -> None:
    assert app.tenants.get_defaults() == (1.0, 10, None, None)
    assert app.tenants.set_defaults(max_running=64) == (1.0, 64, None, None)
    assert app.tenants.get("anyone").max_running == 64  # a tenant without settings of its own
    assert app.tenants.set_defaults(weight=2.0, rate=5.0) == (2.0, 64, 5.0, 5)
    assert app.tenants.set_defaults(rate=None) == (2.0, 64, None, None)
    with pytest.raises(fairq.InvalidInput):
        app.tenants.set_defaults(max_running=-1)
    with pytest.raises(fairq.InvalidInput):
        app.tenants.set_defaults(burst=3)  # a burst needs a rate
    assert app.tenants.get_defaults() == (2.0, 64, None, None)  # refused: nothing written


def test_a_default_cap_below_the_slots_is_said_at_start(
    app: fairq.App, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="fairq"):
        app.worker(concurrency=32).run(until_empty=True)
    (line,) = [r.getMessage() for r in caplog.records if "default max_running" in r.getMessage()]
    assert "at most 10 job(s)" in line and "32 slots" in line
    assert "app.tenants.set_defaults(max_running=N)" in line

    caplog.clear()
    app.tenants.set_defaults(max_running=32)
    with caplog.at_level(logging.INFO, logger="fairq"):
        app.worker(concurrency=32).run(until_empty=True)
    assert not [r for r in caplog.records if "default max_running" in r.getMessage()]


def test_task_enqueue_many(app: fairq.App, dsn: str) -> None:
    @app.task(name="reports.send", queue="reports")
    def send(job: fairq.Job) -> None:
        pass

    ids = send.enqueue_many([("acme", {"n": 1}), ("globex", {"n": 2})])
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT id, task, queue, tenant FROM fairq.jobs ORDER BY id").fetchall()
    assert rows == [(ids[0], "reports.send", "reports", "acme"),
                    (ids[1], "reports.send", "reports", "globex")]


def test_queue_depth_per_queue_and_tenant(app: fairq.App, dsn: str) -> None:
    for _ in range(3):
        app.enqueue("t", tenant="acme", queue="a")
    app.enqueue("t", tenant="acme", queue="a", delay=3600)
    app.enqueue("t", tenant="globex", queue="a")
    app.enqueue("t", tenant="acme", queue="b")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE fairq.jobs SET status = 'failed', finished_at = now() "
                     "WHERE queue = 'b'")

    assert app.queue_depth() == QueueDepth(queued=5, due=4, delayed=1, running=0, done=0,
                                           failed=1)
    assert app.queue_depth(queue="a", tenant="acme") == QueueDepth(
        queued=4, due=3, delayed=1, running=0, done=0, failed=0)
    assert app.queue_depth(queue="a").queued == 5
    assert app.queue_depth(tenant="globex").due == 1
    assert app.queue_depth(queue="nowhere") == QueueDepth(0, 0, 0, 0, 0, 0)
    with pytest.raises(fairq.InvalidInput):
        app.queue_depth(queue="")
