"""Enqueue's options are defined once (fairq.app.options): every enqueue method of App and Task
takes them, a misspelled one is one clear ``InvalidInput`` before anything is written, and a
type checker sees them (mypy flags a misspelled keyword on ``Task.enqueue``)."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mypy import api as mypy_api

import fairq
from fairq.app.options import ENQUEUE_OPTIONS, MANY_OPTIONS
from fairq.models import NewJobColumns, TraceContext


class Recorder:
    """A JobSink that keeps what it is given (no database)."""

    def __init__(self) -> None:
        self.jobs: list[NewJobColumns] = []
        self.connections: list[Any] = []

    def put(self, chunks: Iterator[NewJobColumns], *, connection: Any,
            trace: TraceContext | None) -> list[int]:
        got = list(chunks)
        self.jobs.extend(got)
        self.connections.append(connection)
        return list(range(1, sum(len(c) for c in got) + 1))

    async def put_async(self, jobs: NewJobColumns, *, connection: Any,
                        trace: TraceContext | None) -> list[int]:
        return self.put(iter((jobs,)), connection=connection, trace=trace)


def _app() -> tuple[fairq.App, Recorder, fairq.Task[None]]:
    app = fairq.App("postgresql://nobody@127.0.0.1:1/none")
    sink = Recorder()
    app.sink = sink

    @app.task(name="t", queue="q", priority=3)
    def t(job: fairq.Job) -> None:
        return None

    return app, sink, t


def test_every_option_reaches_the_job() -> None:
    _, sink, t = _app()
    marker = object()
    t.enqueue(tenant="acme", payload={"n": 1}, delay=2.5, priority=7, cost=2.0, queue="other",
              max_attempts=3, lease=60, key="k1", connection=marker)
    (jobs,) = sink.jobs
    assert list(jobs.tenants) == ["acme"] and list(jobs.queues) == ["other"]
    assert list(jobs.priorities) == [7] and list(jobs.costs) == [2.0]
    assert list(jobs.max_attempts) == [3] and list(jobs.lease_seconds) == [60]
    assert list(jobs.keys) == ["k1"] and list(jobs.delays) == [2.5]
    assert sink.connections == [marker]
    t.enqueue_many([("a", {}), ("b", {"x": 1})], cost=3.0)
    assert list(sink.jobs[1].tenants) == ["a", "b"] and list(sink.jobs[1].costs) == [3.0, 3.0]
    assert list(sink.jobs[1].queues) == ["q", "q"]  # the task's default


@pytest.mark.parametrize("call", ["app", "task", "many"])
def test_a_misspelled_option_is_one_line_and_writes_nothing(call: str) -> None:
    app, sink, t = _app()
    with pytest.raises(fairq.InvalidInput) as err:
        if call == "app":
            app.enqueue("t", tenant="acme", dealy=5)  # type: ignore[call-arg]
        elif call == "task":
            t.enqueue(tenant="acme", max_attempt=2)  # type: ignore[call-arg]
        else:
            t.enqueue_many([("a", {})], key="k")  # type: ignore[call-arg]
    message = str(err.value)
    assert "\n" not in message and "unknown option" in message
    assert ("'dealy'" in message or "'max_attempt'" in message
            or "'key'" in message), message
    assert "run_at" in message  # it names what the call takes
    assert sink.jobs == []


def test_the_many_options_are_the_ones_every_job_of_a_call_shares() -> None:
    assert MANY_OPTIONS < ENQUEUE_OPTIONS
    assert {"payload", "max_attempts", "lease", "key"} == ENQUEUE_OPTIONS - MANY_OPTIONS


def test_a_type_checker_sees_the_options(tmp_path: Path) -> None:
    snippet = tmp_path / "uses_fairq.py"
    snippet.write_text(textwrap.dedent("""
        import fairq

        app = fairq.App()

        @app.task
        def send(job: fairq.Job) -> None: ...

        send.enqueue(tenant="acme", delay=3, key="k")
        send.enqueue(tenant="acme", dealy=3)
        app.enqueue("send", tenant="acme", priority="high")
    """))
    out, _, status = mypy_api.run(["--strict", "--no-incremental", "--cache-dir", str(tmp_path / "c"),
                                   str(snippet)])
    assert status == 1, out
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert len(errors) == 2, out
    assert '"dealy"' in errors[0] and "uses_fairq.py:10" in errors[0]
    assert "priority" in errors[1] and "uses_fairq.py:11" in errors[1]
