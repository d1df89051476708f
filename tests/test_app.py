"""The producer side of the Python API: transactional enqueue, validation, observer counts."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
import sqlalchemy as sa
from fairtools import sql_rows
from sqlalchemy.orm import Session

import fairq
from fairq.config import sqlalchemy_url
from fairq.observe import NullObserver


class Recorder(NullObserver):
    """Counts enqueues; every other hook is the null observer's."""

    def __init__(self) -> None:
        self.enqueued: dict[tuple[str, str], int] = {}

    def on_enqueue(self, queue: str, tenant: str, count: int) -> None:
        self.enqueued[(queue, tenant)] = self.enqueued.get((queue, tenant), 0) + count


@pytest.fixture
def app(dsn: str) -> Iterator[fairq.App]:
    a = fairq.App(dsn, observer=Recorder())
    yield a
    a.close()


def count_jobs(dsn: str) -> int:
    return int(sql_rows(dsn, "SELECT count(*) FROM fairq.jobs")[0][0])


@pytest.mark.parametrize("commit", [True, False])
def test_enqueue_joins_a_psycopg_transaction(app: fairq.App, dsn: str, commit: bool) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE orders (id int)")
        conn.execute("INSERT INTO orders VALUES (1)")
        app.enqueue("mail", tenant="acme", payload={"order": 1}, connection=conn)
        assert count_jobs(dsn) == 0          # not visible before the caller commits
        conn.commit() if commit else conn.rollback()
    assert count_jobs(dsn) == (1 if commit else 0)


@pytest.mark.parametrize("commit", [True, False])
def test_enqueue_joins_sqlalchemy_connection_and_session(app: fairq.App, dsn: str, commit: bool) -> None:
    engine = sa.create_engine(sqlalchemy_url(dsn))
    try:
        with engine.connect() as conn:
            app.enqueue("mail", tenant="acme", connection=conn)
            conn.commit() if commit else conn.rollback()
        with Session(engine) as session:
            app.enqueue_many("mail", [("a", {}), ("b", {})], connection=session)
            session.commit() if commit else session.rollback()
    finally:
        engine.dispose()
    assert count_jobs(dsn) == (3 if commit else 0)


def test_enqueue_rejects_other_connection_objects(app: fairq.App) -> None:
    with pytest.raises(fairq.InvalidInput, match="psycopg Connection"):
        app.enqueue("mail", tenant="acme", connection=object())


@pytest.mark.parametrize("kwargs", [
    {"tenant": ""}, {"tenant": "x" * 201}, {"tenant": "a\x00b"},
    {"tenant": "t", "payload": {"f": float("nan")}}, {"tenant": "t", "payload": {1, 2}},
    {"tenant": "t", "cost": 0}, {"tenant": "t", "priority": 40000},
    {"tenant": "t", "delay": -1}, {"tenant": "t", "run_at": datetime(2030, 1, 1)},
    {"tenant": "t", "delay": 1, "run_at": datetime.now(UTC)},
    {"tenant": "t", "payload": "x" * 1_000_001},
])
def test_bad_input_raises_before_anything_is_written(app: fairq.App, dsn: str, kwargs: dict) -> None:
    with pytest.raises(fairq.InvalidInput):
        app.enqueue("mail", **kwargs)
    assert count_jobs(dsn) == 0


def test_unknown_task_is_refused_when_the_app_registers_tasks(app: fairq.App, dsn: str) -> None:
    @app.task(queue="reports")
    def render(job: fairq.Job) -> None: ...

    with pytest.raises(fairq.InvalidInput, match="unknown task"):
        app.enqueue("nope", tenant="acme")
    job_id = render.enqueue(tenant="acme", payload={"r": 1})
    info = app.job(job_id)
    assert info is not None and info.queue == "reports" and info.task == render.name


def test_enqueue_many_is_validated_whole_first(app: fairq.App, dsn: str) -> None:
    with pytest.raises(fairq.InvalidInput):
        app.enqueue_many("mail", [("a", {}), ("", {})])
    assert count_jobs(dsn) == 0
    ids = app.enqueue_many("mail", [(f"t{i % 7}", {"i": i}) for i in range(12_000)])
    assert len(ids) == 12_000 and ids == sorted(ids) and count_jobs(dsn) == 12_000


def test_observer_counts_enqueues_per_queue_and_tenant(app: fairq.App) -> None:
    app.enqueue("mail", tenant="acme")
    app.enqueue_many("mail", [("acme", {}), ("globex", {}), ("acme", {})], queue="bulk")
    assert isinstance(app.observer, Recorder)
    assert app.observer.enqueued == {("default", "acme"): 1, ("bulk", "acme"): 2, ("bulk", "globex"): 1}


def test_delay_and_run_at_use_the_database_clock(app: fairq.App, dsn: str) -> None:
    later = app.enqueue("mail", tenant="a", delay=timedelta(hours=1))
    fixed = app.enqueue("mail", tenant="a", run_at=datetime(2031, 5, 1, tzinfo=UTC))
    (ahead,), = sql_rows(dsn, "SELECT run_at - now() > interval '59 minutes' FROM fairq.jobs WHERE id = %s",
                         (later,))
    assert ahead
    info = app.job(fixed)
    assert info is not None and info.run_at == datetime(2031, 5, 1, tzinfo=UTC)


def test_cancel_only_queued_jobs(app: fairq.App, store: fairq.App) -> None:
    job_id = app.enqueue("mail", tenant="a")
    assert app.cancel(job_id) is True
    assert app.cancel(job_id) is False
    info = app.job(job_id)
    assert info is not None and info.status == "cancelled"
    assert app.job(10**12) is None
    with pytest.raises(fairq.InvalidInput):
        app.cancel(0)
