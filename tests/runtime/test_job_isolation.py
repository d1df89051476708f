"""One job's bad payload harms no other job: the enqueue limits (nesting depth, size), a stored
payload the worker cannot decode failing that job alone, floats reaching handlers as floats,
and a hypothesis test driving payload shapes through enqueue, claim and handler."""

from __future__ import annotations

import contextlib
import json
import math
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fairq
from fairq.cli import main
from fairq.validation import MAX_PAYLOAD_BYTES, MAX_PAYLOAD_DEPTH


def nested(depth: int) -> Any:
    """A payload nested ``depth`` levels deep (``[]`` is one level)."""
    d: Any = []
    for _ in range(depth - 1):
        d = [d]
    return d


@pytest.fixture
def app(dsn: str) -> Iterator[fairq.App]:
    a = fairq.App(dsn, schema="fairq")
    yield a
    a.close()


def job_rows(dsn: str) -> dict[int, tuple[str, str, int, str | None]]:
    with psycopg.connect(dsn) as c:
        return {r[0]: r[1:] for r in c.execute(
            "SELECT id, tenant, status, attempts, last_error FROM fairq.jobs")}


def test_enqueue_limits_depth_and_size(app: fairq.App) -> None:
    app.enqueue("t", tenant="a", payload=nested(MAX_PAYLOAD_DEPTH))
    with pytest.raises(fairq.InvalidInput, match="nested 101 levels deep; the limit is 100"):
        app.enqueue("t", tenant="a", payload=nested(MAX_PAYLOAD_DEPTH + 1))
    with pytest.raises(fairq.InvalidInput, match="nested too deeply"):
        app.enqueue("t", tenant="a", payload=nested(5000))  # past Python's own recursion limit
    # Brackets inside strings are text, not nesting.
    app.enqueue("t", tenant="a", payload={"s": "[" * 5000})
    fits = "x" * (MAX_PAYLOAD_BYTES - 2)  # two bytes of quotes
    app.enqueue("t", tenant="a", payload=fits)
    with pytest.raises(fairq.InvalidInput, match=f"the limit is {MAX_PAYLOAD_BYTES}"):
        app.enqueue("t", tenant="a", payload=fits + "x")


def test_cli_deep_payload_is_one_line_exit_2(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--dsn", dsn, "enqueue", "t", "--tenant", "a",
                 "--payload", "[" * 990 + "]" * 990])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "nested" in err


def test_floats_reach_the_handler_as_floats(app: fairq.App, dsn: str) -> None:
    seen: list[Any] = []

    @app.task(name="t", lease=30)
    def t(job: fairq.Job) -> None:
        seen.append(job.payload)

    payload = {"big": 1e20, "huge": -1.7e308, "small": 5e-324, "one": 1.0, "int": 10**20,
               "text": "1e+20 stays text"}
    app.enqueue("t", tenant="a", payload=payload)
    app.worker(concurrency=1, listen=False, poll_interval=0.2).run(until_empty=True)
    (got,) = seen
    assert got == payload
    assert {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in payload.items()}


def test_undecodable_payload_fails_its_job_alone(app: fairq.App, dsn: str) -> None:
    """A payload nested ~985 deep (written in SQL: enqueue refuses it) in a batch with nine other
    tenants' jobs: it fails at once with a clear last_error, the nine run, `fairq job` shows it."""
    ran: list[str] = []
    lock = threading.Lock()

    @app.task(name="t", lease=3, max_attempts=3)
    def t(job: fairq.Job) -> None:
        assert job.tenant != "strings" or job.payload == "123"
        with lock:
            ran.append(job.tenant)

    evil = app.enqueue("t", tenant="evil", payload={})
    with psycopg.connect(dsn) as c:  # the poison: nested past Python's recursion limit
        c.execute("UPDATE fairq.jobs SET payload = %s::jsonb WHERE id = %s",
                  ("[" * 985 + "]" * 985, evil))
    string_job = app.enqueue("t", tenant="strings", payload="123")  # a JSON string, not a number
    others = [app.enqueue("t", tenant=f"tenant{i}", payload={"i": i}) for i in range(9)]
    worker = app.worker(concurrency=10, batch=10, listen=False, poll_interval=0.2)
    worker.run(until_empty=True)

    rows = job_rows(dsn)
    assert sorted(ran) == sorted([*(f"tenant{i}" for i in range(9)), "strings"])
    assert rows[string_job][1] == "done"
    assert all(rows[i][1] == "done" and rows[i][2] == 1 for i in others)
    _, status, attempts, error = rows[evil]
    assert (status, attempts) == ("failed", 1)  # for good, not after three lease expiries
    assert error is not None and error.startswith("payload cannot be decoded")
    info = app.job(evil)
    assert info is not None and info.status == "failed"
    assert isinstance(info.payload, fairq.models.UndecodablePayload)
    code = main(["--dsn", dsn, "job", str(evil)])
    assert code == 0


def test_an_observer_error_after_the_claim_strands_no_job(app: fairq.App, dsn: str) -> None:
    from fairq.observe import NullObserver

    class Broken(NullObserver):
        def on_claim(self, *args: Any) -> None:
            raise RuntimeError("metrics bug")

    app.task(lambda job: None, name="t", lease=30)
    ids = [app.enqueue("t", tenant=f"t{i}") for i in range(5)]
    app.worker(concurrency=5, listen=False, poll_interval=0.2,
               observer=Broken()).run(until_empty=True)
    rows = job_rows(dsn)
    assert [rows[i][1:3] for i in ids] == [("done", 1)] * 5


def test_job_with_an_infinite_time_can_be_shown(app: fairq.App, dsn: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """run_at cannot be infinite (jobs_run_at_check); the job's other times can."""
    job_id = app.enqueue("t", tenant="a")
    with psycopg.connect(dsn) as c:
        c.execute("UPDATE fairq.jobs SET created_at = 'infinity' WHERE id = %s", (job_id,))
    info = app.job(job_id)
    assert info is not None and info.created_at.year == 9999
    assert main(["--dsn", dsn, "job", str(job_id)]) == 0
    assert json.loads(capsys.readouterr().out)["created_at"].startswith("9999-12-31")


# -- payload shapes through enqueue, claim and handler ---------------------------------------
storable_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                        max_size=20)
scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=False, allow_infinity=False), storable_text)
shapes = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(storable_text, inner, max_size=4)),
    max_leaves=30)


def deep(depth: int, leaf: Any) -> Any:
    d = leaf
    for _ in range(depth):
        d = [d]
    return d


payloads = st.one_of(
    shapes,
    st.builds(deep, st.integers(min_value=90, max_value=110), scalars),
    st.builds(lambda n, c: c * n, st.sampled_from([MAX_PAYLOAD_BYTES - 2, MAX_PAYLOAD_BYTES]),
              st.sampled_from(["x", "é"])),
)


def depth_of(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth_of, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    return 0


def same(a: Any, b: Any) -> bool:
    """Equal, floats as floats (jsonb has no -0.0: it comes back as 0.0, equal to it)."""
    if isinstance(a, float) or isinstance(b, float):
        return type(a) is type(b) and (a == b or (math.isnan(a) and math.isnan(b)))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(batch=st.lists(payloads, min_size=1, max_size=6))
def test_payload_shapes_each_end_on_their_own(dsn: str, batch: list[Any]) -> None:
    with fairq.App(dsn, schema="fairq") as app:
        with psycopg.connect(dsn) as c:
            c.execute("DELETE FROM fairq.jobs")
        received: dict[int, Any] = {}

        @app.task(name="t", lease=30, max_attempts=1)
        def t(job: fairq.Job) -> None:
            received[job.id] = job.payload
            if isinstance(job.payload, str) and job.payload.startswith("é"):
                raise ValueError("this handler refuses accents")

        accepted: dict[int, Any] = {}
        for i, p in enumerate(batch):
            with contextlib.suppress(fairq.InvalidInput):  # too deep or too big: nothing written
                accepted[app.enqueue("t", tenant=f"t{i}", payload=p)] = p
            refused = not any(q is p for q in accepted.values())
            assert refused == (depth_of(p) > MAX_PAYLOAD_DEPTH or len(json.dumps(
                p, ensure_ascii=False, separators=(",", ":")).encode()) > MAX_PAYLOAD_BYTES)
        app.worker(concurrency=4, listen=False, poll_interval=0.2).run(until_empty=True)
        rows = job_rows(dsn)
        assert rows.keys() == accepted.keys()
        for job_id, p in accepted.items():
            status = rows[job_id][1]
            refused = isinstance(p, str) and p.startswith("é")
            assert status == ("failed" if refused else "done"), (job_id, rows[job_id])
            assert same(received[job_id], {} if p is None else p)  # None: the empty payload
