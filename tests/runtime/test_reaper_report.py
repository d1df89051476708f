"""A reaped lease is never silent: how many and whose in the log, and a counter by outcome."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import psycopg
import pytest
from prometheus_client import CollectorRegistry

import fairq
from fairq.metrics import PrometheusObserver
from fairq.policies import get_policy
from fairq.runtime.maintenance import REAP_LOG_IDS, REAP_LOG_TENANTS, Reaper, reaped_summary
from fairq.store import Store
from tests.support.db import SCHEMA
from tests.support.observability import samples

FIFO = get_policy("fifo")


@pytest.fixture
def app(dsn: str) -> Iterator[fairq.App]:
    a = fairq.App(dsn, schema=SCHEMA)
    yield a
    a.close()


def _expire_all(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE fairq.jobs SET locked_until = now() - interval '1 s' "
                      "WHERE status = 'running'")


def test_the_reaper_logs_how_many_and_whose_and_counts_them(
    app: fairq.App, store: Store, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    ids = [app.enqueue("t", tenant="acme", queue="q") for _ in range(3)]
    ids.append(app.enqueue("t", tenant="globex", queue="q", max_attempts=1))
    assert len(store.claim(FIFO, queue="q", batch=4, worker="w1")) == 4
    _expire_all(dsn)
    observer = PrometheusObserver(CollectorRegistry())
    observer.on_claim("q", "fifo", "claimed", 0.001, [])  # the worker's series exist at 0

    with caplog.at_level(logging.INFO, logger="fairq"):
        assert Reaper(store, observer=observer).run_once() == 4

    (line,) = [r.getMessage() for r in caplog.records if "reaped" in r.getMessage()]
    assert line.startswith("reaped 4 expired lease(s): 3 back in the queue, 1 failed")
    assert f"acme (3 jobs {ids[0]}, {ids[1]}, {ids[2]})" in line
    assert f"globex (job {ids[3]})" in line
    values = samples(observer.registry)
    assert values["fairq_leases_reaped_total{outcome=requeued,queue=q}"] == 3
    assert values["fairq_leases_reaped_total{outcome=failed,queue=q}"] == 1
    assert values["fairq_leases_expired_total{queue=q}"] == 4


def test_a_drain_that_reaps_logs_it_too(
    app: fairq.App, store: Store, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """kill -9 of a worker, then `--until-empty`: the drain reaps the dead worker's leases
    itself, and says so."""
    done: list[int] = []

    @app.task(name="t", queue="q")
    def t(job: fairq.Job) -> None:
        done.append(job.id)

    job_id = app.enqueue("t", tenant="acme", queue="q")
    assert len(store.claim(FIFO, queue="q", batch=1, worker="dead")) == 1
    _expire_all(dsn)

    with caplog.at_level(logging.INFO, logger="fairq"):
        app.worker(concurrency=1, queues=["q"], policy="fifo").run(until_empty=True)

    assert done == [job_id]
    assert any(f"acme (job {job_id})" in r.getMessage() for r in caplog.records)


def test_the_summary_is_bounded() -> None:
    jobs = [(i, "q", f"t{i % (REAP_LOG_TENANTS + 3)}", "queued") for i in range(200)]
    text = reaped_summary(jobs)
    assert text.endswith("and 3 more tenant(s)")
    assert text.count(" jobs ") == REAP_LOG_TENANTS
    assert f", +{200 // (REAP_LOG_TENANTS + 3) + 1 - REAP_LOG_IDS} more)" in text
    assert len(text) < 1000
