"""``app.tenants.explain``: each reason produced by a real database state (claims through the
store, a real worker for the registry), in the documented order (docs/explain.md)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import fairq
from fairq import sql
from fairq.errors import InvalidInput
from fairq.policies import get_policy
from fairq.store.monitor import waits_params
from fairq.store.workers import MISSED_BEATS, register_worker

WEIGHTED = get_policy("weighted")


@pytest.fixture
def app(dsn: str) -> Iterator[fairq.App]:
    a = fairq.App(dsn, schema="fairq")
    a.task(name="t")(lambda job: None)
    yield a
    a.close()


def served(app: fairq.App, queues: tuple[str, ...] = ("default",)) -> None:
    """A live worker in the registry for ``queues`` (its beat every minute)."""
    register_worker(app.store, "test-worker", queues=queues, policy="weighted", beat_seconds=60)


def claim(app: fairq.App, n: int = 1, queue: str = "default") -> list[str]:
    jobs = app.store.claim(WEIGHTED, queue=queue, batch=n, worker="w")
    return [j.tenant for j in jobs]


def test_a_tenant_or_queue_without_jobs_is_no_jobs(app: fairq.App) -> None:
    served(app)
    [e] = app.tenants.explain("nobody")
    assert (e.queue, e.reason) == (None, "no_jobs")
    assert app.tenants.explain("nobody", "default").reason == "no_jobs"
    app.enqueue("t", tenant="a")
    assert app.tenants.explain("a", "elsewhere").reason == "no_jobs"
    assert app.tenants.explain("a", "default").reason == "waiting_turn"
    app.store.finish_done([(j.id, j.attempts) for j in
                           app.store.claim(WEIGHTED, queue="default", batch=1, worker="w")])
    [e] = app.tenants.explain("a")  # its only job done: nothing left anywhere
    assert (e.queue, e.reason) == (None, "no_jobs")
    assert app.tenants.explain("a", "default").reason == "no_jobs"


def test_invalid_names_are_one_line_errors(app: fairq.App) -> None:
    with pytest.raises(InvalidInput, match="tenant must not be empty"):
        app.tenants.explain("")
    with pytest.raises(InvalidInput, match="queue is 201 characters long"):
        app.tenants.explain("a", "q" * 201)


def test_no_worker_until_one_serves_the_queue(app: fairq.App, dsn: str) -> None:
    app.enqueue("t", tenant="a")
    e = app.tenants.explain("a", "default")
    assert (e.reason, e.workers, e.queued) == ("no_worker", 0, 1)
    register_worker(app.store, "other-queue", queues=["other"], policy="weighted",
                    beat_seconds=60)
    assert app.tenants.explain("a", "default").reason == "no_worker"
    served(app)
    e = app.tenants.explain("a", "default")
    assert (e.reason, e.workers, e.policies) == ("waiting_turn", 1, ("weighted",))
    # A worker that missed its beats is dead: the queue is unserved again, and when it was last
    # seen is told.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE fairq.workers SET seen_at = now() - make_interval("
                     "secs => beat_seconds * %s + 1) WHERE worker_id = 'test-worker'",
                     (MISSED_BEATS,))
    e = app.tenants.explain("a", "default")
    assert e.reason == "no_worker" and e.last_worker_seen_at is not None
    assert "no live worker serves this queue" in e.describe()


def test_a_real_worker_serves_its_queues_while_it_runs(app: fairq.App, dsn: str) -> None:
    app.enqueue("t", tenant="a", delay=3600)
    assert app.tenants.explain("a", "default").reason == "no_worker"
    worker = app.worker(queues=["default"], listen=False, heartbeat_interval=0.2,
                        poll_interval=0.1)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        assert worker.ready.wait(20)
        e = app.tenants.explain("a", "default")
        assert (e.reason, e.workers) == ("no_due_jobs", 1)
        with psycopg.connect(dsn) as conn:
            first = conn.execute("SELECT seen_at FROM fairq.workers").fetchone()
        time.sleep(0.6)  # beats every 0.2 s
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT worker_id, queues, policy, beat_seconds, seen_at "
                               "FROM fairq.workers").fetchone()
        assert first is not None and row is not None
        assert row[:4] == (worker.worker_id, ["default"], "weighted", 0.2)
        assert row[4] > first[0]
    finally:
        worker.stop()
        thread.join(30)
    # A clean stop deletes its row: unserved at once, not after its missed beats.
    assert app.tenants.explain("a", "default").reason == "no_worker"
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM fairq.workers").fetchone() == (0,)


def test_running_when_every_job_runs(app: fairq.App) -> None:
    served(app)
    app.enqueue("t", tenant="a")
    claim(app)
    e = app.tenants.explain("a", "default")
    assert (e.reason, e.running, e.queued) == ("running", 1, 0)


def test_at_cap_says_whether_the_cap_is_the_default(app: fairq.App) -> None:
    served(app)
    app.store.set_tenants([], defaults=(1.0, 1))
    for tenant in ("a", "a", "b", "b", "p"):
        app.enqueue("t", tenant=tenant)
    app.tenants.set("b", max_running=1)
    app.tenants.set("p", max_running=0)
    assert sorted(claim(app, 10)) == ["a", "b"]
    a = app.tenants.explain("a", "default")
    assert (a.reason, a.running, a.max_running, a.cap_is_default) == ("at_cap", 1, 1, True)
    assert "the default cap" in a.describe()
    b = app.tenants.explain("b", "default")
    assert (b.reason, b.cap_is_default) == ("at_cap", False)
    p = app.tenants.explain("p", "default")
    assert (p.reason, p.max_running) == ("at_cap", 0) and "paused" in p.describe()


def test_rate_limited_with_the_next_token_time(app: fairq.App) -> None:
    served(app)
    app.tenants.set("a", rate=0.01, burst=1)  # a token every 100 s
    app.enqueue("t", tenant="a")
    app.enqueue("t", tenant="a")
    assert claim(app, 10) == ["a"]
    e = app.tenants.explain("a", "default")
    assert e.reason == "rate_limited" and e.rate == 0.01
    assert e.next_token_at is not None and e.checked_at is not None
    assert timedelta(seconds=95) < e.next_token_at - e.checked_at <= timedelta(seconds=100)


def test_a_token_due_before_the_job_is_no_due_jobs(app: fairq.App) -> None:
    served(app)
    app.tenants.set("a", rate=0.01, burst=1)
    app.enqueue("t", tenant="a")
    app.enqueue("t", tenant="a", delay=3600)  # due after the next token (100 s)
    assert claim(app, 10) == ["a"]
    e = app.tenants.explain("a", "default")
    assert e.reason == "no_due_jobs" and e.next_token_at is not None


def test_no_due_jobs_with_the_next_due_time(app: fairq.App) -> None:
    served(app)
    app.enqueue("t", tenant="a", delay=600)
    e = app.tenants.explain("a", "default")
    assert (e.reason, e.queued, e.due) == ("no_due_jobs", 1, 0)
    assert e.next_due_at is not None and e.checked_at is not None
    assert timedelta(seconds=590) < e.next_due_at - e.checked_at <= timedelta(seconds=600)


def test_waiting_turn_counts_the_tenants_ahead_in_virtual_time(app: fairq.App) -> None:
    served(app)
    for tenant in ("a", "b", "c"):
        for _ in range(3):
            app.enqueue("t", tenant=tenant)
    assert claim(app) == ["a"]  # a is served first and moves behind b and c
    got = {t: app.tenants.explain(t, "default") for t in ("a", "b", "c")}
    assert {t: (e.reason, e.ahead) for t, e in got.items()} == {
        "a": ("waiting_turn", 2), "b": ("waiting_turn", 0), "c": ("waiting_turn", 1)}
    assert "2 tenant(s) ahead" in got["a"].describe()


def test_group_at_share_when_its_group_runs_its_share_and_another_is_ahead(
        app: fairq.App) -> None:
    served(app)
    app.groups.set("g1", weight=1.0)
    app.groups.set("g2", weight=1.0)
    app.tenants.set("x", group="g1")
    app.tenants.set("y", group="g2")
    app.tenants.set("z", group="g1")
    for tenant in ("x", "y", "z"):
        for _ in range(3):
            app.enqueue("t", tenant=tenant)
    assert claim(app) == ["x"]  # the group factors are refreshed by this claim
    x = app.tenants.explain("x", "default")
    assert (x.reason, x.tenant_group, x.group_running, x.queue_running) == (
        "group_at_share", "g1", 1, 1)
    assert x.group_share == pytest.approx(0.5) and x.ahead_other_groups == 1
    assert "group g1 runs 1 of the queue's 1 jobs, its share being 50%" in x.describe()
    # z has run nothing, but its group runs its share and y, of another group, is ahead of it.
    assert app.tenants.explain("z", "default").reason == "group_at_share"
    assert app.tenants.explain("y", "default").reason == "waiting_turn"  # first in line


def test_without_groups_the_same_state_is_waiting_turn(app: fairq.App) -> None:
    served(app)
    for tenant in ("x", "y"):
        for _ in range(3):
            app.enqueue("t", tenant=tenant)
    assert claim(app) == ["x"]
    x = app.tenants.explain("x", "default")
    assert (x.reason, x.ahead, x.ahead_other_groups) == ("waiting_turn", 1, 0)


def test_without_a_queue_one_answer_per_queue_with_jobs(app: fairq.App) -> None:
    served(app, ("default", "mail"))
    app.enqueue("t", tenant="a", queue="mail", delay=60)
    app.enqueue("t", tenant="a")
    app.enqueue("t", tenant="b", queue="reports")
    got = app.tenants.explain("a")
    assert [(e.queue, e.reason) for e in got] == [("default", "waiting_turn"),
                                                   ("mail", "no_due_jobs")]
    assert [(e.queue, e.reason) for e in app.tenants.explain("b")] == [("reports", "no_worker")]


def test_the_order_no_worker_before_at_cap(app: fairq.App) -> None:
    """Two reasons hold; the earlier in the documented order is the answer."""
    app.tenants.set("a", max_running=0)
    app.enqueue("t", tenant="a")
    assert app.tenants.explain("a", "default").reason == "no_worker"
    served(app)
    assert app.tenants.explain("a", "default").reason == "at_cap"


def _plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _plan_nodes(child)


def test_the_read_stays_linear_in_the_tenants(app: fairq.App, dsn: str) -> None:
    """Every tenant of a queue at once (the exporter's read): no plan node handles more than a
    few rows per tenant, whatever the planner estimates (a join of two per-tenant sets on
    (queue, tenant), planned as a merge on the queue alone, handled tenants^2 rows)."""
    n = 2000
    served(app)
    app.groups.set("gold", weight=2.0)
    app.enqueue_many("t", [(f"t{i:05d}", {}) for i in range(n) for _ in range(2)])
    for i in range(0, 100, 7):
        app.tenants.set(f"t{i:05d}", group="gold")
    for _ in range(20):
        claim(app, 10)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ANALYZE")
        (plan,), = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + sql.statement("tenant_waits", "fairq"),
            waits_params(None, None)).fetchall()
    nodes = list(_plan_nodes(plan[0]["Plan"]))
    handled = max(node["Actual Rows"] * node["Actual Loops"]
                  + node.get("Rows Removed by Join Filter", 0)
                  + node.get("Rows Removed by Filter", 0) for node in nodes)
    assert handled <= 20 * n, handled


def test_a_beat_removes_the_rows_of_workers_gone_for_a_day(app: fairq.App, dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO fairq.workers (worker_id, queues, policy, beat_seconds, "
                     "started_at, seen_at) VALUES ('crashed', '{default}', 'weighted', 10, "
                     "now() - interval '3 days', now() - interval '25 hours'), ('recent', "
                     "'{default}', 'weighted', 10, now(), now() - interval '1 hour')")
        served(app)
        assert sorted(r[0] for r in conn.execute("SELECT worker_id FROM fairq.workers")) == [
            "recent", "test-worker"]
