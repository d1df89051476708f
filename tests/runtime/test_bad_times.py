"""Times outside [1970-01-01, 9999-01-01) UTC: refused at every Python entry and the CLI; a
claimed job whose stored run_at Python cannot hold (written in SQL past the checks) fails alone,
the drain never ends with jobs it claimed stranded, and ``fairq job`` still shows such a job."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

import fairq
from fairq.cli import main
from fairq.store import Store

MESSAGE = "run_at must be between 1970-01-01 and 9999-01-01 UTC"
UTC_PLUS_5 = timezone(timedelta(hours=5))
OUTSIDE = [
    datetime(1, 1, 1, tzinfo=UTC_PLUS_5),  # year 0 in UTC
    datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    datetime(1970, 1, 1, 4, 59, tzinfo=UTC_PLUS_5),
    datetime(9999, 1, 1, tzinfo=UTC),
    datetime(9998, 12, 31, 20, tzinfo=timezone(timedelta(hours=-5))),
    datetime.max.replace(tzinfo=UTC),
]


@pytest.fixture
def app(dsn: str) -> Iterator[fairq.App]:
    a = fairq.App(dsn, schema="fairq")
    yield a
    a.close()


def count_jobs(dsn: str) -> int:
    with psycopg.connect(dsn) as c:
        row = c.execute("SELECT count(*) FROM fairq.jobs").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("when", OUTSIDE, ids=str)
def test_every_python_entry_refuses_a_time_out_of_range(app: fairq.App, dsn: str,
                                                        when: datetime) -> None:
    @app.task(name="t")
    def t(job: fairq.Job) -> None:
        pass

    entries: list[Any] = [
        lambda: app.enqueue("t", tenant="a", run_at=when),
        lambda: app.enqueue_many("t", [("a", {}), ("b", {})], run_at=when),
        lambda: t.enqueue(tenant="a", run_at=when),
        lambda: t.enqueue_many([("a", {})], run_at=when),
        lambda: asyncio.run(app.enqueue_async("t", tenant="a", run_at=when)),
        lambda: asyncio.run(app.enqueue_many_async("t", [("a", {})], run_at=when)),
        lambda: asyncio.run(t.enqueue_async(tenant="a", run_at=when)),
    ]
    for entry in entries:
        with pytest.raises(fairq.InvalidInput) as info:
            entry()
        assert str(info.value) == MESSAGE
    assert count_jobs(dsn) == 0


def test_the_range_ends_are_as_documented(app: fairq.App) -> None:
    first = app.enqueue("t", tenant="a", run_at=datetime(1970, 1, 1, tzinfo=UTC))
    last = app.enqueue("t", tenant="a",
                       run_at=datetime(9998, 12, 31, 23, 59, 59, 999999, tzinfo=UTC))
    shown = [app.job(first), app.job(last)]
    assert [j.run_at.year for j in shown if j is not None] == [1970, 9998]
    # The longest delay is ten years, always inside the range.
    app.enqueue("t", tenant="a", delay=timedelta(days=3650))


@pytest.mark.parametrize("text", ["0001-01-01T00:00:00+05:00", "9999-01-01T00:00:00Z",
                                  "1969-12-31T23:00:00+00:00"])
def test_cli_run_at_out_of_range_is_one_line_exit_2(dsn: str, text: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--dsn", dsn, "enqueue", "t", "--no-app", "--tenant", "a", "--run-at", text])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip().splitlines() == [f"fairq enqueue: {MESSAGE}"]
    assert count_jobs(dsn) == 0


def test_cli_run_at_in_range_and_malformed(dsn: str, app: fairq.App,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dsn", dsn, "enqueue", "t", "--no-app", "--tenant", "a",
                 "--run-at", "2030-05-01T10:00:00+02:00"]) == 0
    job_id = int(capsys.readouterr().out)
    info = app.job(job_id)
    assert info is not None and info.run_at == datetime(2030, 5, 1, 8, tzinfo=UTC)
    for bad in (["--run-at", "2030-05-01T10:00:00"], ["--run-at", "tomorrow"],
                ["--run-at", "2030-05-01T10:00:00Z", "--delay", "5"]):
        assert main(["--dsn", dsn, "enqueue", "t", "--no-app", "--tenant", "a", *bad]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1


def drop_run_at_checks(conn: psycopg.Connection[Any]) -> None:
    """Drop any CHECK on jobs.run_at, so that a test can write what only SQL past the checks
    could (the schema may or may not have such a constraint)."""
    names = [r[0] for r in conn.execute(
        "SELECT conname FROM pg_constraint WHERE conrelid = 'fairq.jobs'::regclass "
        "AND contype = 'c' AND pg_get_constraintdef(oid) LIKE '%run_at%'")]
    for name in names:
        conn.execute(f'ALTER TABLE fairq.jobs DROP CONSTRAINT "{name}"')


def set_run_at(dsn: str, job_id: int, text: str) -> None:
    with psycopg.connect(dsn) as c:
        drop_run_at_checks(c)
        c.execute("UPDATE fairq.jobs SET run_at = %s::timestamptz WHERE id = %s",
                  (text, job_id))


def job_rows(dsn: str) -> dict[int, tuple[str, int, str | None]]:
    with psycopg.connect(dsn) as c:
        return {r[0]: r[1:] for r in c.execute(
            "SELECT id, status, attempts, last_error FROM fairq.jobs")}


@pytest.mark.parametrize("stored", ["0044-03-15 00:00:00+00 BC", "0001-01-01 00:00:00+05"])
def test_a_claimed_job_whose_run_at_cannot_be_read_fails_alone(
        app: fairq.App, dsn: str, stored: str, capsys: pytest.CaptureFixture[str]) -> None:
    """One bad row in a batch with five other tenants' jobs: the five run, the bad one fails at
    once (one attempt) with a last_error that says why, and the drain ends with none running."""
    ran: list[str] = []

    @app.task(name="t", lease=30, max_attempts=3)
    def t(job: fairq.Job) -> None:
        ran.append(job.tenant)

    bad = app.enqueue("t", tenant="bad")
    others = [app.enqueue("t", tenant=f"tenant{i}") for i in range(5)]
    set_run_at(dsn, bad, stored)
    app.worker(concurrency=6, batch=6, listen=False, poll_interval=0.2).run(until_empty=True)
    rows = job_rows(dsn)
    assert sorted(ran) == [f"tenant{i}" for i in range(5)]
    assert all(rows[i][:2] == ("done", 1) for i in others)
    status, attempts, error = rows[bad]
    assert (status, attempts) == ("failed", 1)
    assert error is not None and error.startswith("run_at ") and "cannot be decoded" in error
    assert " BC" in error


@pytest.mark.parametrize("stored", ["0044-03-15 00:00:00+00 BC", "10000-01-01 00:00:00+00"])
def test_a_job_whose_run_at_cannot_be_read_is_shown(app: fairq.App, dsn: str, stored: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    job_id = app.enqueue("t", tenant="a")
    set_run_at(dsn, job_id, stored)
    info = app.job(job_id)
    assert info is not None and str(info.run_at).startswith(stored.split(" ")[0])
    assert main(["--dsn", dsn, "job", str(job_id)]) == 0
    assert f'"run_at": "{stored.split(" ")[0]}' in capsys.readouterr().out
    assert main(["--dsn", dsn, "jobs"]) == 0
    assert stored.split(" ")[0] in capsys.readouterr().out


def test_the_drain_does_not_end_with_claimed_jobs_stranded(
        app: fairq.App, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim that commits but whose rows never reach the worker (here: its first claim's
    rows are lost): ``run(until_empty=True)`` goes on until those leases expire and the jobs
    come back, instead of ending with them ``running``."""
    ran: list[int] = []

    @app.task(name="t", lease=1)
    def t(job: fairq.Job) -> None:
        ran.append(job.id)

    ids = [app.enqueue("t", tenant=f"tenant{i}") for i in range(3)]
    real_claim = Store.claim
    lost = []

    def claim(self: Store, *args: Any, **kwargs: Any) -> Any:
        jobs = real_claim(self, *args, **kwargs)
        if jobs and not lost:
            lost.extend(jobs)
            raise psycopg.DataError("rows that cannot be read")
        return jobs

    monkeypatch.setattr(Store, "claim", claim)
    app.worker(concurrency=3, batch=3, listen=False, poll_interval=0.2,
               reap_interval=0.2).run(until_empty=True)
    rows = job_rows(dsn)
    assert lost
    assert [rows[i][0] for i in ids] == ["done"] * 3
    assert sorted(ran) == sorted(ids)


def test_cli_job_unknown_id_is_exit_2(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dsn", dsn, "job", "424242"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["fairq job: no job 424242"]
    assert main(["--dsn", dsn, "cancel", "424242"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
