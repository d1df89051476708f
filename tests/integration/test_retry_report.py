"""``retry`` reports per job: it retries each job that can be, says for each other one why not
(unknown, not failed or cancelled, its idempotency key held again by a live job), and never
lets one job's raw database error take the rest of the batch with it."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

import fairq
from fairq.cli import main


@pytest.fixture
def app(dsn: str) -> Iterator[fairq.App]:
    a = fairq.App(dsn, schema="fairq")
    yield a
    a.close()


def fail(dsn: str, *ids: int) -> None:
    with psycopg.connect(dsn) as c:
        c.execute("UPDATE fairq.jobs SET status = 'failed', attempts = 1, finished_at = now(), "
                  "last_error = 'boom' WHERE id = ANY(%s)", (list(ids),))


def statuses(dsn: str) -> dict[int, str]:
    with psycopg.connect(dsn) as c:
        return {r[0]: r[1] for r in c.execute("SELECT id, status FROM fairq.jobs")}


def test_a_key_in_use_again_is_reported_and_the_rest_retried(
        app: fairq.App, dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case: inv-1 failed, inv-1 enqueued again, a job without a key failed too."""
    keyed = app.enqueue("t", tenant="a", key="inv-1")
    plain = app.enqueue("t", tenant="a")
    fail(dsn, keyed, plain)
    again = app.enqueue("t", tenant="a", key="inv-1")
    assert again != keyed
    code = main(["--dsn", dsn, "retry", "--failed"])
    out, err = capsys.readouterr()
    assert code == 2
    assert out.strip() == f"retried 1 job(s): {plain}"
    assert err.strip().splitlines() == [
        f"fairq retry: job {keyed} not retried: its idempotency key 'inv-1' is held by job "
        f"{again}, queued or running: a key belongs to one live job of its task and tenant"]
    assert statuses(dsn) == {keyed: "failed", plain: "queued", again: "queued"}


def test_python_returns_a_result_per_job(app: fairq.App, dsn: str) -> None:
    keyed = app.enqueue("t", tenant="a", key="k")
    ok = app.enqueue("t", tenant="a")
    queued = app.enqueue("t", tenant="b")
    fail(dsn, keyed, ok)
    holder = app.enqueue("t", tenant="a", key="k")
    result = app.retry(keyed, ok, queued, 999_999)
    assert result == [ok]
    assert list(result.not_retried) == sorted([keyed, queued, 999_999])
    assert f"held by job {holder}" in result.not_retried[keyed]
    assert result.not_retried[queued] == "it is queued; only failed or cancelled jobs can be retried"
    assert result.not_retried[999_999] == "no such job"
    # Nothing to report: an empty not_retried.
    fail(dsn, ok)
    assert app.retry(ok).not_retried == {}


def test_two_failed_jobs_with_one_key_retry_the_first(app: fairq.App, dsn: str) -> None:
    first = app.enqueue("t", tenant="a", key="dup")
    fail(dsn, first)
    second = app.enqueue("t", tenant="a", key="dup")
    fail(dsn, second)
    other_task = app.enqueue("u", tenant="a", key="dup")  # a key belongs to its task
    fail(dsn, other_task)
    result = app.retry(failed=True)
    assert other_task in result
    retried_dup = [i for i in result if i in (first, second)]
    assert len(retried_dup) == 1
    left = second if retried_dup == [first] else first
    assert result.not_retried == {
        left: f"its idempotency key 'dup' is held by job {retried_dup[0]}, retried now: a key "
              "belongs to one live job of its task and tenant"}
    assert statuses(dsn)[left] == "failed"


def test_a_unique_violation_fails_its_job_alone(app: fairq.App, dsn: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A key index stricter than retry's own check (here: one per task and key, whatever the
    tenant) raises in the database: the job it refuses is reported, the batch retried."""
    with psycopg.connect(dsn) as c:
        c.execute("CREATE UNIQUE INDEX jobs_strict_key_idx ON fairq.jobs (task, key) "
                  "WHERE key IS NOT NULL AND status IN ('queued', 'running')")
    keyed = app.enqueue("t", tenant="a", key="shared")
    plain = [app.enqueue("t", tenant="a") for _ in range(3)]
    fail(dsn, keyed, *plain)
    app.enqueue("t", tenant="b", key="shared")  # the key, live, in another tenant
    code = main(["--dsn", dsn, "retry", str(keyed), *map(str, plain)])
    out, err = capsys.readouterr()
    assert code == 2
    assert out.startswith("retried 3 job(s)")
    (line,) = err.strip().splitlines()
    assert line.startswith(f"fairq retry: job {keyed} not retried: its idempotency key is held "
                           "by another queued or running job (Key (task, key)=(t, shared)")
    result = app.retry(failed=True)
    assert result == [] and list(result.not_retried) == [keyed]
    assert [statuses(dsn)[i] for i in plain] == ["queued"] * 3


def test_retry_of_unknown_ids_is_exit_2(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dsn", dsn, "retry", "5", "6"]) == 2
    out, err = capsys.readouterr()
    assert out.strip() == "retried 0 job(s)"
    assert err.strip().splitlines() == ["fairq retry: job 5 not retried: no such job",
                                        "fairq retry: job 6 not retried: no such job"]


def test_retry_with_nothing_to_report_is_exit_0(app: fairq.App, dsn: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    job = app.enqueue("t", tenant="a", key="k")
    fail(dsn, job)
    assert main(["--dsn", dsn, "retry", "--failed"]) == 0
    assert capsys.readouterr().out.strip() == f"retried 1 job(s): {job}"
    assert main(["--dsn", dsn, "retry", "--failed"]) == 0
    assert capsys.readouterr().out.strip() == "retried 0 job(s)"
