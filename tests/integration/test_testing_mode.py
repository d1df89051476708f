"""fairq.testing against PostgreSQL, through its own pytest plugin's fixtures: inline runs a job
at once and writes nothing, drain runs due jobs in fair order and finishes them as a worker
does, the assertions list what is there, and a job of the test's open transaction is seen
before it commits and gone after the rollback."""

from __future__ import annotations

import asyncio
import time

import pytest

import fairq
from fairq import testing
from fairq.models import TenantConfig


@pytest.fixture(autouse=True)
def _database(admin_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin's fixtures find the database where a user's do: $FAIRQ_DATABASE_URL (here
    the suite's server; they make and drop their own schema on it)."""
    monkeypatch.setenv("FAIRQ_DATABASE_URL", admin_dsn)
    monkeypatch.delenv("FAIRQ_SCHEMA", raising=False)


@pytest.fixture
def app(fairq_app: fairq.App) -> fairq.App:
    return fairq_app


def _register(app: fairq.App) -> dict[str, fairq.Task[object]]:
    @app.task(name="echo", max_attempts=2)
    def echo(job: fairq.Job) -> object:
        if job.payload.get("boom"):
            raise ValueError(f"boom for {job.tenant}")
        return {"n": job.payload.get("n")}

    @app.task(name="later", queue="slow")
    async def later(job: fairq.Job) -> str:
        await asyncio.sleep(0)
        return "awaited"

    return {"echo": echo, "later": later}


def test_the_plugin_gives_a_fresh_migrated_schema(app: fairq.App) -> None:
    assert app.schema.startswith("fairq_test_")
    assert testing.enqueued(app) == []
    assert app.tenants.list() == []


def test_inline_runs_at_once_writes_nothing_and_propagates(app: fairq.App) -> None:
    tasks = _register(app)
    with testing.inline(app) as run:
        job_id = tasks["echo"].enqueue(tenant="acme", payload={"n": 1}, delay=3600)
        assert job_id < 0  # not a stored job's id
        with pytest.raises(ValueError, match="boom for beta"):
            app.enqueue("echo", tenant="beta", payload={"boom": True})
        with pytest.raises(fairq.InvalidInput, match="unknown option"):
            app.enqueue("echo", tenant="acme", dealy=1)  # type: ignore[call-arg]
        assert tasks["later"].enqueue(tenant="acme") < 0  # an async handler, run to its end
    assert [(o.tenant, o.status) for o in run.outcomes] == [
        ("acme", "done"), ("beta", "failed"), ("acme", "done")]
    assert run.outcomes[0].result == {"n": 1} and run.outcomes[2].result == "awaited"
    assert isinstance(run.outcomes[1].error, ValueError)
    assert testing.enqueued(app, status=None) == []
    # Outside the block (manual, the default) jobs are enqueued for real.
    tasks["echo"].enqueue(tenant="acme", payload={"n": 2})
    assert len(testing.enqueued(app)) == 1


def test_inline_async_enqueue_awaits_the_handler(app: fairq.App) -> None:
    tasks = _register(app)

    async def main() -> list[testing.Outcome]:
        with testing.inline(app) as run:
            await tasks["later"].enqueue_async(tenant="acme")
            await tasks["echo"].enqueue_async(tenant="acme", payload={"n": 5})
        return run.outcomes

    outcomes = asyncio.run(main())
    assert [(o.task, o.result) for o in outcomes] == [("later", "awaited"), ("echo", {"n": 5})]


def test_drain_runs_due_jobs_in_fair_order_and_finishes_them(app: fairq.App) -> None:
    tasks = _register(app)
    tasks["echo"].enqueue_many([("big", {"n": i}) for i in range(6)])
    tasks["echo"].enqueue_many([("small", {"n": i}) for i in range(2)])
    tasks["echo"].enqueue(tenant="small", payload={"boom": True})
    tasks["echo"].enqueue(tenant="big", payload={"n": 99}, delay=3600)  # not due
    tasks["later"].enqueue(tenant="big")
    outcomes = testing.drain(app)
    assert testing.statuses(outcomes) == {"done": 9, "retry": 1}
    echo = [o.tenant for o in outcomes if o.task == "echo"]
    # Fair: the small tenant's three jobs are served within the first six, not after big's six.
    assert echo[:6].count("small") == 3, echo
    retry = next(o for o in outcomes if o.status == "retry")
    assert isinstance(retry.error, ValueError) and retry.attempt == 1
    info = app.job(outcomes[0].job_id)
    assert info is not None and info.status == "done" and info.result == outcomes[0].result
    assert next(o for o in outcomes if o.task == "later").result == "awaited"
    # What is left: the delayed job and the retry (queued for a later attempt).
    left = testing.enqueued(app)
    assert sorted(j.tenant for j in left) == ["big", "small"]
    assert testing.drain(app) == []


def test_drain_one_queue_and_one_tenant(app: fairq.App) -> None:
    tasks = _register(app)
    app.tenants.set("capped", max_running=1)
    tasks["echo"].enqueue_many([(t, {"n": i}) for i in range(3) for t in ("a", "b", "capped")])
    tasks["later"].enqueue(tenant="b")
    only_b = testing.drain(app, tenant="b", queue="default")
    assert [(o.tenant, o.status) for o in only_b] == [("b", "done")] * 3
    # The others' jobs were handed back unstarted: no attempt spent, all still queued.
    a_jobs = testing.enqueued(app, tenant="a")
    assert len(a_jobs) == 3 and all(j.attempts == 0 for j in a_jobs)
    assert len(testing.enqueued(app, "later", tenant="b")) == 1
    rest = testing.drain(app, queue="default")
    assert testing.statuses(rest) == {"done": 6}
    assert testing.drain(app, queue="slow")[0].result == "awaited"


def test_drain_pays_no_worker_start_up(app: fairq.App) -> None:
    """The docs' figure: ten jobs enqueued and drained, after the schema exists."""
    tasks = _register(app)
    t0 = time.perf_counter()
    tasks["echo"].enqueue_many([(f"t{i % 3}", {"n": i}) for i in range(10)])
    outcomes = testing.drain(app)
    elapsed = time.perf_counter() - t0
    assert testing.statuses(outcomes) == {"done": 10}
    print(f"\nenqueue + drain of 10 jobs: {elapsed * 1000:.0f} ms")


def test_assertions_list_what_is_there(app: fairq.App) -> None:
    tasks = _register(app)
    tasks["echo"].enqueue(tenant="acme", payload={"report": 7, "fmt": "pdf"})
    tasks["echo"].enqueue(tenant="beta", payload={"report": 8})
    (found,) = testing.assert_enqueued(app, tasks["echo"], tenant="acme", payload={"report": 7})
    assert found.payload == {"report": 7, "fmt": "pdf"}
    testing.assert_enqueued(app, "echo", count=2)
    testing.refute_enqueued(app, "echo", tenant="acme", payload={"report": 8})
    with pytest.raises(AssertionError) as err:
        testing.assert_enqueued(app, "echo", tenant="gamma")
    text = str(err.value)
    assert "expected a job with task='echo', tenant='gamma'" in text and "found 0" in text
    assert "tenant='acme'" in text and "tenant='beta'" in text and "'report': 7" in text
    with pytest.raises(AssertionError, match="expected no job with task='echo'"):
        testing.refute_enqueued(app, "echo")
    with pytest.raises(AssertionError, match="expected 3 job"):
        testing.assert_enqueued(app, count=3)


def test_the_tests_own_transaction_before_commit(app: fairq.App, fairq_connection: object) -> None:
    _register(app)
    app.enqueue("echo", tenant="acme", payload={"n": 1}, connection=fairq_connection)
    testing.assert_enqueued(app, "echo", tenant="acme", connection=fairq_connection)
    testing.refute_enqueued(app, "echo")  # other sessions do not see it before the commit
    fairq_connection.rollback()  # type: ignore[attr-defined]
    testing.refute_enqueued(app, "echo", connection=fairq_connection)


def test_fresh_schema_keeps_the_apps_tasks_and_points_it_back(app: fairq.App) -> None:
    _register(app)
    outer = app.schema
    with testing.fresh_schema(app) as inner:
        assert inner is app and app.schema != outer and "echo" in app.tasks
        app.enqueue("echo", tenant="acme")
        assert len(testing.enqueued(app)) == 1
    assert app.schema == outer and testing.enqueued(app) == []
    app.store.set_tenants([TenantConfig("acme", 2.0, 3)])
    assert app.tenants.get("acme") is not None
