"""The producer side of the Python API: transactional enqueue, validation, observer counts."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import fairq
import fairq.app.enqueue
from fairq.config import sqlalchemy_url
from fairq.observe import NullObserver
from fairq.validation import MAX_PAYLOAD_BYTES
from tests.support.fairtools import sql_rows


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
    {"tenant": "t", "payload": "x" * (MAX_PAYLOAD_BYTES + 1)},
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


def test_enqueue_many_sends_chunks_as_it_checks_them_and_commits_all_or_none(
        app: fairq.App, dsn: str) -> None:
    """Chunks go down a pipeline while the next is checked: a bad item in the third chunk
    writes nothing, nor does one the server refuses; good ones come back in input order."""
    items: list[tuple[str, object]] = [(f"t{i % 7}", {"i": i}) for i in range(12_000)]
    with pytest.raises(fairq.InvalidInput, match="tenant"):
        app.enqueue_many("mail", [*items[:11_000], ("", {}), *items[11_000:]])
    assert count_jobs(dsn) == 0
    with pytest.raises(fairq.InvalidInput, match="the limit is 200"):
        app.enqueue_many("mail", iter([*items[:11_000], ("x" * 201, {})]))
    assert count_jobs(dsn) == 0
    jobs = fairq.app.enqueue.new_jobs({}, "mail", items, run_at=None, delay=None,
                                      priority=None, cost=None, queue=None)
    costs = [1.0] * len(items)
    costs[7_000] = -1.0  # only the SQL checks see this one, in the second chunk
    with pytest.raises(fairq.InvalidInput, match="cost must be > 0"):
        app.store.enqueue(dataclasses.replace(jobs, costs=costs))
    assert count_jobs(dsn) == 0
    ids = app.enqueue_many("mail", items)
    assert len(ids) == 12_000 and ids == sorted(ids)
    rows = sql_rows(dsn, "SELECT id, tenant, payload->>'i' FROM fairq.jobs ORDER BY id")
    assert [(t, int(i)) for _, t, i in rows] == [(t, p["i"]) for t, p in items]  # type: ignore[index]
    assert [r[0] for r in rows] == ids


def test_enqueue_many_of_empty_payloads_stores_empty_objects(app: fairq.App, dsn: str) -> None:
    """A chunk whose payloads are all {} or None sends none (NULL: the default); a chunk with
    one other payload sends them all."""
    items: list[tuple[str, object]] = [(f"t{i % 3}", None if i % 2 else {}) for i in range(6_000)]
    items[5_500] = ("t0", {"only": 1})
    ids = app.enqueue_many("mail", items)
    rows = sql_rows(dsn, "SELECT id, payload FROM fairq.jobs ORDER BY id")
    assert [r[0] for r in rows] == ids
    assert [r[1] for r in rows] == [{"only": 1} if i == 5_500 else {} for i in range(6_000)]


def test_enqueue_many_in_the_callers_transaction_checks_every_chunk_first(
        app: fairq.App, dsn: str) -> None:
    """With ``connection=`` nothing is written before every item is checked: a caller that
    catches the refusal and commits commits none of them."""
    items: list[tuple[str, object]] = [(f"t{i % 7}", {"i": i}) for i in range(11_000)]
    with psycopg.connect(dsn) as conn:
        with pytest.raises(fairq.InvalidInput):
            app.enqueue_many("mail", [*items, ("", {})], connection=conn)
        conn.commit()
        assert count_jobs(dsn) == 0
        ids = app.enqueue_many("mail", items, connection=conn)
        assert count_jobs(dsn) == 0  # not before the caller commits
        conn.commit()
    assert len(ids) == 11_000 and ids == sorted(ids) and count_jobs(dsn) == 11_000


def test_enqueue_many_returns_ids_in_input_order_with_each_jobs_fields(app: fairq.App, dsn: str) -> None:
    items = [(f"t{(i * 7) % 5}", {"i": i, "s": "é\"{}," if i % 3 else None}) for i in range(11_000)]
    items[5] = ("t1", None)  # no payload: {}
    ids = app.enqueue_many("mail", iter(items), priority=-3, cost=2, queue="bulk")  # any iterable
    rows = {r[0]: r[1:] for r in sql_rows(
        dsn, "SELECT id, tenant, payload, priority, cost, queue, task, max_attempts, lease_seconds "
             "FROM fairq.jobs")}
    assert len(ids) == len(set(ids)) == len(rows) == 11_000
    for job_id, (tenant, payload) in zip(ids, items, strict=True):
        assert rows[job_id] == (tenant, {} if payload is None else payload, -3, 2.0, "bulk", "mail", 5, 300)
    states = sql_rows(dsn, "SELECT tenant, active, wake_at FROM fairq.tenant_schedule "
                           "WHERE queue = 'bulk' ORDER BY tenant")
    assert states == [(f"t{k}", True, None) for k in range(5)]


@pytest.mark.parametrize("bad", [
    [("a", {}), ("b", {}), (["a"], {})],  # an unhashable tenant
    [("a", {}), ("a", {"x": float("nan")})],  # a bad payload of a tenant seen before
    [("a", {}), ("a", {}), ("b" * 201, {})],
])
def test_enqueue_many_refuses_a_bad_later_item_before_writing(app: fairq.App, dsn: str,
                                                             bad: list[tuple[object, object]]) -> None:
    with pytest.raises(fairq.InvalidInput):
        app.enqueue_many("mail", bad)  # type: ignore[arg-type]
    assert count_jobs(dsn) == 0
    assert app.enqueue_many("mail", []) == []
    assert app.enqueue_many("mail", [], priority=10**9) == []  # nothing to check options against


@pytest.mark.parametrize("tenant", ["", "a"])
@pytest.mark.parametrize("kwargs", [{"priority": 10**6}, {"delay": -1}, {"queue": ""}, {"cost": 0}])
def test_enqueue_many_checks_like_enqueue_in_the_same_order(app: fairq.App, tenant: str,
                                                           kwargs: dict[str, object]) -> None:
    with pytest.raises(fairq.InvalidInput) as one:
        app.enqueue("mail", tenant=tenant, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(fairq.InvalidInput) as many:
        app.enqueue_many("mail", [(tenant, {}), ("b", {})], **kwargs)  # type: ignore[arg-type]
    assert str(many.value) == str(one.value)


def test_enqueue_many_delayed_jobs_set_their_tenants_wake_at(app: fairq.App, dsn: str) -> None:
    at = datetime(2031, 5, 1, tzinfo=UTC)
    app.enqueue_many("mail", [("a", {}), ("b", {})], run_at=at)
    app.enqueue_many("mail", [("b", {}), ("c", {})], delay=3600)
    got = {t: (active, wake) for t, active, wake in sql_rows(
        dsn, "SELECT tenant, active, wake_at FROM fairq.tenant_schedule")}
    (c_wake,), = sql_rows(dsn, "SELECT run_at FROM fairq.jobs WHERE tenant = 'c'")
    (b_wake,), = sql_rows(dsn, "SELECT min(run_at) FROM fairq.jobs WHERE tenant = 'b'")
    assert got["a"] == (False, at) and got["c"] == (False, c_wake) and got["b"] == (False, b_wake)
    assert b_wake < at and c_wake > datetime.now(UTC) + timedelta(minutes=59)


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
