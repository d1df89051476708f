"""Periodic schedules: declared in code, listed by the CLI, one job per tick whatever the number
of workers, only the latest missed tick after downtime, ticks on the database clock."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

import fairq
from fairq.cli import main
from fairq.observe import NullObserver
from fairq.runtime.maintenance import MaintenanceSchedule, PeriodicScheduler
from fairq.runtime.periodic import latest_tick, next_tick
from fairq.store import Store

FAIRQ = Path(sys.executable).parent / "fairq"


@pytest.fixture
def app(dsn: str) -> Iterator[fairq.App]:
    a = fairq.App(dsn)

    @a.task(name="report", queue="reports", max_attempts=2, lease=60)
    def report(job: fairq.Job) -> None:
        return None

    yield a
    a.close()


def scalar(dsn: str, query: str, *params: Any) -> Any:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


# -- declaring ---------------------------------------------------------------------------------
def test_declared_with_the_decorator_or_a_call(app: fairq.App) -> None:
    @app.periodic(cron="0 2 * * *", tenant="acme", payload={"kind": "nightly"})
    @app.periodic(cron="0 2 * * *", tenant="globex")
    @app.task(name="nightly")
    def nightly(job: fairq.Job) -> None:
        return None

    app.periodic("report", cron="*/15 * * * *", tenant="acme", queue="urgent", priority=3)
    app.periodic("report", cron="30 * * * * *", tenant="acme", name="report-fast")
    assert isinstance(nightly, fairq.app.Task)  # the decorator hands the task back
    assert set(app.periodics) == {("nightly", "acme"), ("nightly", "globex"),
                                  ("report", "acme"), ("report-fast", "acme")}
    job = app.periodics[("report", "acme")].job
    assert (job.task, job.queue, job.priority, job.max_attempts, job.lease_seconds) == \
        ("report", "urgent", 3, 2, 60)
    assert json.loads(app.periodics[("nightly", "acme")].job.payload_json) == {"kind": "nightly"}


@pytest.mark.parametrize("call, said", [
    (lambda a: a.periodic("report", cron="0 25 * * *", tenant="acme"), "invalid cron"),
    (lambda a: a.periodic("report", cron="every day", tenant="acme"), "invalid cron"),
    (lambda a: a.periodic("report", cron=5, tenant="acme"), "cron must be a string"),
    (lambda a: a.periodic("nope", cron="* * * * *", tenant="acme"), "not registered"),
    (lambda a: a.periodic("report", cron="* * * * *", tenant=""), "tenant"),
    (lambda a: a.periodic("report", cron="* * * * *", tenant="a", payload={1j}), "payload"),
    (lambda a: a.periodic(cron="* * * * *", tenant="a")(lambda job: None), "above @app.task"),
])
def test_bad_declarations_are_refused(app: fairq.App, call: Any, said: str) -> None:
    with pytest.raises(fairq.InvalidInput, match=said):
        call(app)
    assert app.periodics == {}


def test_one_schedule_per_name_and_tenant(app: fairq.App) -> None:
    app.periodic("report", cron="0 2 * * *", tenant="acme")
    with pytest.raises(fairq.InvalidInput, match="already declared"):
        app.periodic("report", cron="0 3 * * *", tenant="acme")


@pytest.mark.parametrize("expr", ["* * * * * *", "*/10 * * * * *", "0,30 * * * * *",
                                  "0-1 0 1 1 * *"])
def test_crons_that_fire_more_than_once_a_minute_are_refused(app: fairq.App, expr: str) -> None:
    """An idle worker runs the schedules on its polls (every 5 s by default) and enqueues the
    latest due tick: ticks closer together would be skipped, so they are refused up front."""
    with pytest.raises(fairq.InvalidInput) as info:
        app.periodic("report", cron=expr, tenant="acme")
    assert str(info.value).startswith(f"cron {expr!r} fires more than once a minute")
    with pytest.raises(fairq.InvalidInput):
        app.periodic(cron=expr, tenant="acme")(app.tasks["report"])
    assert app.periodics == {}
    for once_a_minute in ("30 * * * * *", "0 */5 * * * *", "* * * * *"):
        app.periodic("report", cron=once_a_minute, tenant="acme", name=f"r{once_a_minute}")


def test_cron_maths_on_whole_ticks() -> None:
    at = datetime(2026, 11, 30, 2, 0, tzinfo=UTC)
    assert latest_tick("0 2 * * *", at) == at  # a tick at now counts as due
    assert latest_tick("0 2 * * *", at.replace(microsecond=5)) == at
    assert next_tick("0 2 * * *", at) == datetime(2026, 12, 1, 2, 0, tzinfo=UTC)
    assert latest_tick("*/2 * * * * *", at.replace(second=3)) == at.replace(second=2)


# -- the scheduler, in process ------------------------------------------------------------------
def test_first_sight_waits_for_the_next_tick_and_downtime_enqueues_only_the_latest(
        app: fairq.App, dsn: str) -> None:
    app.periodic("report", cron="0 0 1 1 *", tenant="acme", payload={"year": True})  # yearly
    enqueued: list[tuple[str, str, int]] = []

    class Observer(NullObserver):
        def on_enqueue(self, queue: str, tenant: str, count: int) -> None:
            enqueued.append((queue, tenant, count))

    service = PeriodicScheduler(app.store, app.periodics, observer=Observer())
    assert service.run_once() == 0  # first sight: recorded, nothing enqueued
    this_year = scalar(dsn, "SELECT date_trunc('year', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'")
    assert scalar(dsn, "SELECT last_tick FROM fairq.periodic") == this_year
    assert scalar(dsn, "SELECT count(*) FROM fairq.jobs") == 0
    # Down for five years: five ticks missed, one job, for the latest of them.
    with psycopg.connect(dsn) as conn:
        conn.execute("UPDATE fairq.periodic SET last_tick = last_tick - interval '5 years'")
    assert service.run_once() == 1
    assert service.run_once() == 0
    with psycopg.connect(dsn) as conn:
        jobs = conn.execute("SELECT id, task, tenant, queue, payload, run_at FROM fairq.jobs"
                            ).fetchall()
        state = conn.execute("SELECT last_tick, last_job_id FROM fairq.periodic").fetchone()
    assert [j[1:] for j in jobs] == [("report", "acme", "reports", {"year": True}, this_year)]
    assert state == (this_year, jobs[0][0])
    assert enqueued == [("reports", "acme", 1)]  # fairq_jobs_enqueued_total counts it


def test_a_drain_enqueues_the_due_tick_and_runs_it(app: fairq.App, dsn: str) -> None:
    app.periodic("report", cron="* * * * *", tenant="acme")
    PeriodicScheduler(app.store, app.periodics).run_once()  # registered earlier
    with psycopg.connect(dsn) as conn:
        conn.execute("UPDATE fairq.periodic SET last_tick = last_tick - interval '1 hour'")
    app.worker(policy="fifo", listen=False).run(until_empty=True)
    assert scalar(dsn, "SELECT array_agg(status) FROM fairq.jobs") == ["done"]


def test_many_schedulers_at_once_enqueue_a_tick_once(app: fairq.App, dsn: str) -> None:
    app.periodic("report", cron="* * * * *", tenant="acme")
    stores = [Store(dsn, "fairq", max_size=1) for _ in range(8)]
    try:
        PeriodicScheduler(stores[0], app.periodics).run_once()
        for round_ in range(3):
            with psycopg.connect(dsn) as conn:  # the minute's tick is due again
                conn.execute("UPDATE fairq.periodic SET last_tick = last_tick - interval '1 hour'")
            barrier = threading.Barrier(len(stores))
            fired: list[int] = []

            def go(store: Store, barrier: threading.Barrier, fired: list[int]) -> None:
                service = PeriodicScheduler(store, app.periodics)
                barrier.wait()
                fired.append(service.run_once())

            threads = [threading.Thread(target=go, args=(s, barrier, fired)) for s in stores]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert sorted(fired) == [0] * (len(stores) - 1) + [1], round_
        assert scalar(dsn, "SELECT count(*) FROM fairq.jobs") == 3
    finally:
        for s in stores:
            s.close()


def test_every_worker_checks_its_own_schedules_without_an_election(app: fairq.App,
                                                                   dsn: str) -> None:
    app.periodic("report", cron="* * * * *", tenant="acme")
    ran: list[int] = []

    class Counting(PeriodicScheduler):
        def run_once(self) -> int:
            ran.append(1)
            return super().run_once()

    for _ in range(2):  # two workers' schedules, right after one another
        MaintenanceSchedule(app.store, [Counting(app.store, app.periodics)]).run_due()
    assert len(ran) == 2
    assert scalar(dsn, "SELECT count(*) FROM fairq.settings WHERE key LIKE %s", "%periodic%") == 0


# -- real workers -----------------------------------------------------------------------------
APP = '''
import fairq

app = fairq.App()

@app.periodic(cron="* * * * *", tenant="acme", payload={"who": "acme"})
@app.periodic(cron="* * * * *", tenant="globex")
@app.task(queue="ticks")
def tick(job):
    return {"tick": job.run_at.isoformat()}
'''


def test_several_worker_processes_enqueue_each_tick_once(dsn: str, tmp_path: Path) -> None:
    """Three worker processes, polling five times a second, on two schedules whose tick is due
    (registered an hour ago): each tick is enqueued once, by one of them, and run."""
    module = f"ticks_{secrets.token_hex(4)}"
    (tmp_path / f"{module}.py").write_text(APP)
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO fairq.periodic (name, tenant, task, cron, last_tick) "
                     "SELECT %(name)s, t, %(name)s, '* * * * *', date_trunc('minute', now()) "
                     "- interval '1 hour' FROM unnest(ARRAY['acme', 'globex']) t",
                     {"name": f"{module}.tick"})
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRQ_")}
    env["FAIRQ_DATABASE_URL"] = dsn
    workers = [subprocess.Popen([str(FAIRQ), "worker", f"{module}:app", "--concurrency", "2",
                                 "--poll-interval", "0.2", "--log-level", "warning"],
                                cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
               for _ in range(3)]
    try:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:  # both ticks run, then every worker polls again
            if scalar(dsn, "SELECT count(*) FILTER (WHERE status = 'done') FROM fairq.jobs") >= 2:
                break
            assert all(w.poll() is None for w in workers), "a worker exited"
            time.sleep(0.2)
        time.sleep(1.0)  # five more polls of each worker, past the tick
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        errors = [w.communicate(timeout=60)[1] for w in workers]
    assert [w.returncode for w in workers] == [0, 0, 0], errors
    with psycopg.connect(dsn) as conn:
        per_tick = conn.execute(
            "SELECT tenant, run_at, count(*) FROM fairq.jobs GROUP BY 1, 2 ORDER BY 2, 1"
        ).fetchall()
        last = conn.execute("SELECT tenant, last_tick FROM fairq.periodic ORDER BY 1").fetchall()
    ticks = {t: r for t, r, _ in per_tick}
    assert sorted(ticks) == ["acme", "globex"]
    assert all(n == 1 for _, _, n in per_tick), per_tick  # one job per tick and tenant
    # Ticks are whole minutes of the database clock, and the last one is recorded.
    assert all(run_at.second == 0 and run_at.microsecond == 0 for _, run_at, _ in per_tick)
    assert last == [(tenant, max(r for t, r, _ in per_tick if t == tenant))
                    for tenant in ("acme", "globex")]


# -- the command line ---------------------------------------------------------------------------
LISTED = '''
import fairq

app = fairq.App()

@app.periodic(cron="0 2 * * *", tenant="acme")
@app.task(name="nightly", queue="reports")
def nightly(job):
    return None
'''


def test_cli_lists_the_apps_schedules_and_the_undeclared_ones(
        dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    module = f"listed_{secrets.token_hex(4)}"
    (tmp_path / f"{module}.py").write_text(LISTED)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FAIRQ_DATABASE_URL", dsn)
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO fairq.periodic (name, tenant, task, cron, last_tick) "
                     "VALUES ('gone', 'acme', 'gone', '* * * * *', now())")
    try:
        assert main(["periodic", "list", "--app", f"{module}:app", "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert [(s["name"], s["tenant"], s["cron"], s["queue"], s["declared"]) for s in shown] == [
            ("nightly", "acme", "0 2 * * *", "reports", True), ("gone", "acme", "* * * * *", None,
                                                                False)]
        assert shown[0]["last_tick"] is None and shown[0]["next_tick"].endswith("02:00:00+00:00")
        assert main(["periodic", "--app", f"{module}:app"]) == 0
        out = capsys.readouterr().out
        assert "nightly" in out and "not declared by this app" in out
        assert main(["periodic", "list"]) == 2  # --app is required
        assert "--app" in capsys.readouterr().err
    finally:
        sys.modules.pop(module, None)
