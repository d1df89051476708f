"""Leases: bounded (per task, per enqueue, per extension), reaped before a drain concludes, and
kept alive by heartbeats that a held lock cannot delay."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import fairq
from fairq.validation import MAX_LEASE_SECONDS


@pytest.fixture
def app(dsn: str) -> Iterator[fairq.App]:
    a = fairq.App(dsn, schema="fairq")
    yield a
    a.close()


def lease_end(dsn: str, job_id: int) -> Any:
    with psycopg.connect(dsn) as c:
        row = c.execute("SELECT locked_until - now() FROM fairq.jobs WHERE id = %s",
                        (job_id,)).fetchone()
    assert row is not None
    return row[0]


def test_lease_bounds_per_task_and_enqueue(app: fairq.App) -> None:
    app.task(lambda job: None, name="ok", lease=MAX_LEASE_SECONDS)
    with pytest.raises(fairq.InvalidInput, match="lease"):
        app.task(lambda job: None, name="long", lease=MAX_LEASE_SECONDS + 1)
    app.enqueue("ok", tenant="a", lease=MAX_LEASE_SECONDS)
    with pytest.raises(fairq.InvalidInput, match=f"between 1 and {MAX_LEASE_SECONDS}"):
        app.enqueue("ok", tenant="a", lease=MAX_LEASE_SECONDS + 1)


@pytest.mark.parametrize("seconds", [1e11, 1e12, MAX_LEASE_SECONDS + 1, math.inf, math.nan, 0,
                                     -5, True, "60"])
def test_extend_lease_beyond_the_maximum_is_refused(app: fairq.App, dsn: str,
                                                    seconds: Any) -> None:
    outcome: dict[str, Any] = {}
    extended = threading.Event()

    @app.task(name="t", lease=30)
    def t(job: fairq.Job) -> None:
        before = lease_end(dsn, job.id)
        try:
            job.extend_lease(seconds)
        except fairq.InvalidInput as e:
            outcome["error"] = str(e)
        outcome["unchanged"] = lease_end(dsn, job.id).total_seconds() <= before.total_seconds()
        job.extend_lease(MAX_LEASE_SECONDS)  # the maximum itself is fine
        outcome["max"] = lease_end(dsn, job.id).total_seconds()
        extended.set()

    app.enqueue("t", tenant="a")
    app.worker(concurrency=1, listen=False, poll_interval=0.2).run(until_empty=True)
    assert extended.is_set()
    assert "lease extension must be" in outcome["error"]
    assert outcome["unchanged"]
    assert MAX_LEASE_SECONDS - 60 < outcome["max"] <= MAX_LEASE_SECONDS
