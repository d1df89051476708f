"""An operator's commands against PostgreSQL: list jobs, retry failed ones, cancel a tenant's
backlog, reset or delete a tenant; alone and under a running worker."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import fairq
from fairq.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def rows(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(query, params).fetchall()


def statuses(dsn: str) -> dict[int, str]:
    return {r[0]: r[1] for r in rows(dsn, "SELECT id, status FROM fairq.jobs")}


def make_app(dsn: str, fail: set[str] | None = None) -> fairq.App:
    """An app whose task fails (max_attempts=1: for good) for the tenants in ``fail``."""
    app = fairq.App(dsn)
    failing = fail if fail is not None else set()

    def handler(job: fairq.Job) -> None:
        if job.tenant in failing:
            raise RuntimeError(f"boom for {job.tenant}\nsecond line")

    app.task(name="t", max_attempts=1, lease=30)(handler)
    return app


@pytest.fixture
def app(dsn: str) -> Iterator[fairq.App]:
    a = make_app(dsn, {"bad"})
    yield a
    a.close()


def drain(app: fairq.App) -> None:
    app.worker(policy="weighted", listen=False, concurrency=4).run(until_empty=True)


def test_jobs_lists_with_filters(capsys: pytest.CaptureFixture[str], app: fairq.App,
                                 dsn: str) -> None:
    ids = [app.enqueue("t", tenant=t, queue=q) for t, q in
           (("a", "default"), ("b", "default"), ("a", "other"), ("bad", "default"))]
    app.cancel(ids[1])
    assert [j.id for j in app.jobs()] == sorted(ids, reverse=True)
    assert [j.id for j in app.jobs(tenant="a")] == [ids[2], ids[0]]
    assert [j.id for j in app.jobs(status="cancelled")] == [ids[1]]
    assert [j.id for j in app.jobs(queue="other", tenant="a", task="t")] == [ids[2]]
    assert len(app.jobs(limit=2)) == 2
    code, out, _ = run(capsys, "--dsn", dsn, "jobs", "--tenant", "a", "--json")
    assert code == 0 and [j["id"] for j in json.loads(out)] == [ids[2], ids[0]]
    code, out, _ = run(capsys, "--dsn", dsn, "jobs", "--status", "queued", "--limit", "1")
    lines = out.strip().splitlines()
    assert code == 0 and len(lines) == 2 and lines[1].split()[:3] == [str(ids[3]), "queued", "bad"]
    code, _, err = run(capsys, "--dsn", dsn, "jobs", "--status", "exploded")
    assert code == 2 and "exploded" in err
    with pytest.raises(fairq.InvalidInput):
        app.jobs(status="exploded")
    with pytest.raises(fairq.InvalidInput):
        app.jobs(limit=0)


def test_retry_failed_jobs_reactivates_their_idle_tenant(
        capsys: pytest.CaptureFixture[str], dsn: str) -> None:
    fail = {"bad"}
    app = make_app(dsn, fail)
    try:
        bad = [app.enqueue("t", tenant="bad") for _ in range(3)]
        good = app.enqueue("t", tenant="good")
        drain(app)
        assert {i: statuses(dsn)[i] for i in bad} == dict.fromkeys(bad, "failed")
        # The tenant left the runnable set with its last due job.
        assert rows(dsn, "SELECT active FROM fairq.tenant_schedule WHERE tenant = 'bad'") == [
            (False,)]
        fail.clear()  # the bug is fixed; retry
        code, out, _ = run(capsys, "--dsn", dsn, "retry", "--failed", "--tenant", "bad")
        assert code == 0 and "retried 3 job(s)" in out, out
        got = rows(dsn, "SELECT status, attempts, last_error IS NOT NULL FROM fairq.jobs "
                   "WHERE tenant = 'bad'")
        assert got == [("queued", 0, True)] * 3  # the old error stays for reference
        # Runnable again, at the queue's virtual time (no banked credit).
        assert rows(dsn, "SELECT active, wake_at IS NULL, vtime = fairq.queue_vtime(queue) "
                    "FROM fairq.tenant_schedule WHERE tenant = 'bad'") == [(True, True, True)]
        drain(app)
        assert all(statuses(dsn)[i] == "done" for i in [*bad, good])
        # Retrying by id: only failed or cancelled jobs; done ones are left alone.
        c = app.enqueue("t", tenant="c", delay=3600)
        app.cancel(c)
        assert app.retry(c, good) == [c]
        code, out, err = run(capsys, "--dsn", dsn, "retry", str(good))
        assert code == 2 and "retried 0 job(s)" in out
        assert err.strip() == (f"fairq retry: job {good} not retried: it is done; only failed "
                               "or cancelled jobs can be retried")
    finally:
        app.close()


def test_retry_usage_errors(capsys: pytest.CaptureFixture[str], app: fairq.App, dsn: str) -> None:
    for argv in (("retry",), ("retry", "1", "--failed"), ("retry", "1", "--tenant", "a")):
        code, out, err = run(capsys, "--dsn", dsn, *argv)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (argv, err)
    with pytest.raises(fairq.InvalidInput):
        app.retry()
    with pytest.raises(fairq.InvalidInput):
        app.retry(1, failed=True)


def test_retry_is_bounded_by_limit(app: fairq.App, dsn: str) -> None:
    app.enqueue_many("t", [("bad", {}) for _ in range(5)])
    drain(app)
    assert len(app.retry(failed=True, limit=2)) == 2
    assert sorted(statuses(dsn).values()) == ["failed"] * 3 + ["queued"] * 2


def test_cancel_tenant_cancels_queued_jobs_only(
        capsys: pytest.CaptureFixture[str], app: fairq.App, dsn: str) -> None:
    a = app.enqueue_many("t", [("a", {}) for _ in range(5)])
    other_q = app.enqueue("t", tenant="a", queue="other")
    b = app.enqueue("t", tenant="b")
    with psycopg.connect(dsn, autocommit=True) as conn:  # one of a's jobs is running elsewhere
        conn.execute("UPDATE fairq.jobs SET status = 'running', attempts = 1, "
                     "locked_until = now() + interval '1 minute', locked_by = 'w' WHERE id = %s",
                     (a[0],))
    code, out, _ = run(capsys, "--dsn", dsn, "cancel", "--tenant", "a", "--queue", "default")
    assert code == 0 and "cancelled 4 queued job(s) of tenant a in queue default" in out, out
    st = statuses(dsn)
    assert st[a[0]] == "running" and all(st[i] == "cancelled" for i in a[1:])
    assert st[other_q] == "queued" and st[b] == "queued"
    assert app.cancel_tenant("a") == 1 and statuses(dsn)[other_q] == "cancelled"
    assert rows(dsn, "SELECT locked_by FROM fairq.jobs WHERE id = %s", a[0]) == [("w",)]
    code, _, err = run(capsys, "--dsn", dsn, "cancel", "7", "--tenant", "a")
    assert code == 2 and "not both" in err
    code, _, err = run(capsys, "--dsn", dsn, "cancel", "--tenant", "")
    assert code == 2


def test_tenants_reset_and_delete(capsys: pytest.CaptureFixture[str], app: fairq.App,
                                  dsn: str) -> None:
    app.tenants.set("acme", weight=5.0, max_running=3)
    job = app.enqueue("t", tenant="acme")
    assert rows(dsn, "SELECT weight, max_running FROM fairq.tenant_schedule "
                "WHERE tenant = 'acme'") == [(5.0, 3)]
    code, out, _ = run(capsys, "--dsn", dsn, "tenants", "reset", "acme")
    assert code == 0 and "defaults apply" in out
    assert rows(dsn, "SELECT weight, max_running FROM fairq.tenant_schedule "
                "WHERE tenant = 'acme'") == [(1.0, 10)]
    assert not app.tenants.get("acme").configured
    code, _, err = run(capsys, "--dsn", dsn, "tenants", "delete", "acme")
    assert code == 2 and "1 queued and 0 running" in err and "fairq cancel --tenant" in err
    assert rows(dsn, "SELECT count(*) FROM fairq.tenant_schedule WHERE tenant = 'acme'") == [(1,)]
    app.cancel(job)
    app.tenants.set("acme", weight=2.0)
    code, out, _ = run(capsys, "--dsn", dsn, "tenants", "delete", "acme")
    assert code == 0 and "acme: deleted" in out
    assert "acme" not in {t.tenant for t in app.tenants.list()}
    assert app.tenants.delete("acme") is False
    # A tenant that comes back starts afresh.
    again = app.enqueue("t", tenant="acme")
    drain(app)
    assert statuses(dsn)[again] == "done"


def test_bulk_operations_under_a_running_worker(dsn: str) -> None:
    """Cancel a big backlog and retry failed jobs while a worker claims: no running job is
    touched, every job ends in a final state, and the schedule's running counts stay exact."""
    fail = {"bad"}
    app = make_app(dsn, fail)
    started = threading.Event()

    def slow(job: fairq.Job) -> None:
        started.set()
        time.sleep(0.002)
        if job.tenant in fail:
            raise RuntimeError("boom")

    app.tasks.clear()
    app.task(name="t", max_attempts=1, lease=30)(slow)
    worker = app.worker(policy="weighted", concurrency=4, poll_interval=0.2)
    thread = threading.Thread(target=worker.run, daemon=True)
    try:
        app.enqueue_many("t", [("big", {}) for _ in range(3000)])
        app.enqueue_many("t", [("bad", {}) for _ in range(50)])
        thread.start()
        assert started.wait(30)
        cancelled = app.cancel_tenant("big")
        assert cancelled > 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and rows(
                dsn, "SELECT count(*) FROM fairq.jobs WHERE tenant = 'bad' AND status <> 'failed'"
        )[0][0]:
            time.sleep(0.05)
        fail.clear()
        assert len(app.retry(failed=True, tenant="bad")) == 50
        while time.monotonic() < deadline and rows(
                dsn, "SELECT count(*) FROM fairq.jobs WHERE status IN ('queued', 'running')"
        )[0][0]:
            time.sleep(0.05)
    finally:
        worker.stop()
        thread.join(60)
        app.close()
    by_status = dict(rows(dsn, "SELECT status, count(*) FROM fairq.jobs GROUP BY 1"))
    assert by_status.get("cancelled") == cancelled
    assert by_status.get("done") == 3050 - cancelled
    assert rows(dsn, "SELECT count(*) FROM fairq.jobs WHERE tenant = 'bad' "
                "AND status <> 'done'") == [(0,)]
    # Cancelled jobs were never started: the worker kept what it had claimed.
    assert rows(dsn, "SELECT count(*) FROM fairq.jobs WHERE status = 'cancelled' "
                "AND started_at IS NOT NULL") == [(0,)]
    assert rows(dsn, "SELECT coalesce(sum(fairq.tenant_running(ts)), 0) "
                     "FROM fairq.tenant_schedule ts") == [(0,)]


def test_retry_after_the_tenant_was_deleted_recreates_its_schedule(app: fairq.App,
                                                                   dsn: str) -> None:
    """Failed jobs do not keep a tenant alive; retrying them brings it back, runnable."""
    failed = app.enqueue("t", tenant="bad")
    drain(app)
    assert statuses(dsn)[failed] == "failed"
    assert app.tenants.delete("bad") is True
    assert rows(dsn, "SELECT count(*) FROM fairq.tenant_schedule WHERE tenant = 'bad'") == [(0,)]
    assert app.retry(failed) == [failed]
    assert rows(dsn, "SELECT active, fairq.tenant_running(ts) FROM fairq.tenant_schedule ts "
                "WHERE tenant = 'bad'") == [(True, 0)]
    app.tasks.clear()
    app.task(name="t", max_attempts=1)(lambda job: None)
    drain(app)
    assert statuses(dsn)[failed] == "done"
