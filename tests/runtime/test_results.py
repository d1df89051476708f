"""Job results: a handler's JSON return value is stored with its finish and read back with
``app.job(id).result`` and ``fairq job ID``; a value that cannot be stored leaves the job done,
with no result and the reason in ``last_error``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fairq
from fairq.cli import main
from fairq.results import MAX_RESULT_BYTES, NOTE_PREFIX, encode_result


@pytest.fixture
def app(dsn: str) -> Iterator[fairq.App]:
    a = fairq.App(dsn)
    yield a
    a.close()


def drain(app: fairq.App, concurrency: int = 4) -> None:
    app.worker(concurrency=concurrency, policy="fifo", listen=False).run(until_empty=True)


def row(dsn: str, job_id: int) -> tuple[str, Any, str | None]:
    with psycopg.connect(dsn) as conn:
        got = conn.execute("SELECT status, result, last_error FROM fairq.jobs WHERE id = %s",
                           (job_id,)).fetchone()
    assert got is not None
    return got  # type: ignore[return-value]


def test_a_returned_value_is_stored_and_read_back(app: fairq.App, dsn: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    @app.task(name="report")
    def report(job: fairq.Job) -> Any:
        return {"rows": job.payload["n"], "tenant": job.tenant, "ok": True, "x": [1.5, None]}

    job_id = report.enqueue(tenant="acme", payload={"n": 7})
    assert app.job(job_id).result is None  # type: ignore[union-attr]
    drain(app)
    expected = {"rows": 7, "tenant": "acme", "ok": True, "x": [1.5, None]}
    assert row(dsn, job_id) == ("done", expected, None)
    info = app.job(job_id)
    assert info is not None and info.result == expected
    assert main(["--dsn", dsn, "job", str(job_id)]) == 0
    assert json.loads(capsys.readouterr().out)["result"] == expected


def test_none_is_no_result_and_scalars_are_results(app: fairq.App, dsn: str) -> None:
    values: list[Any] = [None, 0, "text \u00e9\U0001f680", [], False]

    @app.task(name="scalar")
    def scalar(job: fairq.Job) -> Any:
        return values[job.payload["i"]]

    ids = [scalar.enqueue(tenant="a", payload={"i": i}) for i in range(len(values))]
    drain(app)
    assert [row(dsn, i) for i in ids] == [("done", v, None) for v in values]


def test_each_job_of_a_batched_finish_gets_its_own_result(app: fairq.App, dsn: str) -> None:
    @app.task(name="echo")
    def echo(job: fairq.Job) -> Any:
        return {"id": job.id, "big": "y" * (job.id % 3) * 1000} if job.id % 4 else None

    ids = app.enqueue_many("echo", [(f"t{i % 5}", {}) for i in range(60)])
    drain(app, concurrency=8)
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT id, status, result FROM fairq.jobs").fetchall()
    assert len(rows) == 60
    for job_id, status, result in rows:
        assert status == "done"
        assert result == ({"id": job_id, "big": "y" * (job_id % 3) * 1000} if job_id % 4 else None)
    assert sorted(r[0] for r in rows) == sorted(ids)


@pytest.mark.parametrize("value, said", [
    ("x" * MAX_RESULT_BYTES, f"{MAX_RESULT_BYTES + 2} bytes as JSON; the limit is "),
    ({"when": object()}, "not JSON-serialisable"),
    ({"v": float("nan")}, "not JSON-serialisable"),
    ({"s": "a\x00b"}, "NUL"),
])
def test_a_value_that_cannot_be_stored_leaves_the_job_done_with_a_note(
        app: fairq.App, dsn: str, value: Any, said: str) -> None:
    @app.task(name="odd")
    def odd(job: fairq.Job) -> Any:
        return value

    job_id = odd.enqueue(tenant="a")
    drain(app)
    status, result, last_error = row(dsn, job_id)
    assert (status, result) == ("done", None)
    assert last_error is not None and last_error.startswith(NOTE_PREFIX) and said in last_error


def test_async_handlers_and_retried_jobs_keep_their_results(app: fairq.App, dsn: str) -> None:
    @app.task(name="later")
    async def later(job: fairq.Job) -> Any:
        return {"async": True}

    @app.task(name="flaky", max_attempts=2)
    def flaky(job: fairq.Job) -> Any:
        if job.attempt == 1:
            raise RuntimeError("first try fails")
        return {"attempt": job.attempt}

    a = later.enqueue(tenant="a")
    b = flaky.enqueue(tenant="a")
    drain(app)
    with psycopg.connect(dsn) as conn:  # the retry waits its backoff: make it due now
        conn.execute("UPDATE fairq.jobs SET run_at = now() WHERE id = %s", (b,))
    drain(app)
    assert row(dsn, a) == ("done", {"async": True}, None)
    status, result, last_error = row(dsn, b)
    assert (status, result) == ("done", {"attempt": 2})
    assert last_error is not None and "first try fails" in last_error  # the earlier attempt's


@settings(max_examples=60, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=5), inner, max_size=4), max_leaves=20))
def test_encode_result_round_trips_what_it_stores(value: Any) -> None:
    text, note = encode_result(value)
    if value is None:
        assert (text, note) == (None, None)
    elif text is not None:
        assert note is None and json.loads(text) == value
        assert len(text.encode("utf-8")) <= MAX_RESULT_BYTES
    else:
        assert note is not None and note.startswith(NOTE_PREFIX)


def test_the_limit_is_inclusive() -> None:
    at_limit = "x" * (MAX_RESULT_BYTES - 2)  # two quotes make it exactly the limit
    assert encode_result(at_limit) == (json.dumps(at_limit), None)
    assert encode_result(at_limit + "x")[0] is None
