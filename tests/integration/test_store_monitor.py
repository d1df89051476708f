"""The store's monitoring part (fairq/store/monitor.py): the session the exporter and the claim
probe share keeps its connection through a failed statement, starts afresh after anything else,
and prepares the probe's statement again in a new session."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from fairq.policies import get_policy
from fairq.store import Store
from fairq.store.monitor import MonitorSession, ping, tenant_stats
from tests.support.observability import enqueue


@pytest.fixture
def session(dsn: str) -> Iterator[MonitorSession]:
    s = MonitorSession(dsn, "fairq", application_name="fairq-test-monitor")
    yield s
    s.close()


def test_connect_says_when_a_session_is_new(session: MonitorSession) -> None:
    assert session.connect() is True
    assert session.connect() is False
    session.close()
    assert session.connect() is True


def test_a_failed_statement_keeps_the_session_anything_else_drops_it(
        session: MonitorSession, dsn: str) -> None:
    session.connect()
    with psycopg.connect(dsn) as locker:  # an ACCESS EXCLUSIVE lock: the read gives up
        locker.execute("LOCK TABLE fairq.tenant_schedule IN ACCESS EXCLUSIVE MODE")
        with pytest.raises((psycopg.errors.LockNotAvailable,
                            psycopg.errors.QueryCanceled)) as caught:  # whichever fires first
            session.exporter_snapshot(timeout_ms=50)
    session.recover(caught.value)
    assert session.connect() is False  # still the same session
    session.recover(RuntimeError("a bug outside the database"))
    assert session.connect() is True  # its state was unknown: a new one


def test_the_probe_prepares_again_in_a_new_session(store: Store,
                                                   session: MonitorSession) -> None:
    enqueue(store, "acme", 3)
    policy = get_policy("weighted")
    params = policy.claim_params(queue=session.probe_queue(), batch=2, worker="fairq-probe")
    for expected_plans in (1, 2):
        plan, counts = session.explain_claim(policy.statement, params, statement_timeout_ms=2000,
                                             lock_timeout_ms=200)
        assert plan is not None and plan["Execution Time"] >= 0
        assert counts is not None and sum(counts) == expected_plans
    session.close()  # the prepared statement went with the session
    plan, counts = session.explain_claim(policy.statement, params, statement_timeout_ms=2000,
                                         lock_timeout_ms=200)
    assert plan is not None and counts is not None and sum(counts) == 1
    # Rolled back every time: the tenant's jobs are all still there to claim.
    assert len(store.claim(policy, queue="default", batch=10, worker="w")) == 3


def test_exporter_snapshot_and_stats_read_the_same_backlog(store: Store,
                                                           session: MonitorSession) -> None:
    enqueue(store, "acme", 4)
    tenants, leases, table, waiting = session.exporter_snapshot(timeout_ms=5000)
    assert [(r["tenant"], r["queued"]) for r in tenants] == [("acme", 4)]
    assert leases == {} and table is not None
    assert waiting == {("default", "no_worker"): 1}  # no worker runs here
    rows, waits = tenant_stats(store, window_s=300, queue=None, timeout_ms=5000)
    assert [(r["tenant"], r["due"]) for r in rows] == [("acme", 4)]
    assert [(r["tenant"], r["reason"]) for r in waits] == [("acme", "no_worker")]


def test_ping_raises_when_the_database_does_not_answer(dsn: str) -> None:
    ping(dsn)
    with pytest.raises(psycopg.OperationalError):
        ping(dsn.replace("dbname=fairq_t", "dbname=no_such_db"), timeout=2)
