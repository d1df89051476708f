"""A job's page tells its state as it is: a failed job's error first, a job that failed once
and then passed shows its result and the earlier error as history (not in red), and only a
running job is "held by" a worker."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

import fairq
from fairq.policies import get_policy
from fairq.web import security as sec
from fairq.web.server import create_app

WEIGHTED = get_policy("weighted")


@pytest.fixture
def app(dsn: str) -> Iterator[fairq.App]:
    a = fairq.App(dsn, schema="fairq")
    yield a
    a.close()


def page(app: fairq.App, job: int) -> str:
    web = create_app(app, guard=sec.Guard(None, False), hosts=sec.allowed_hosts("127.0.0.1", []))
    r = TestClient(web, base_url="http://127.0.0.1").get(f"/jobs/{job}")
    assert r.status_code == 200
    return r.text


def claim(app: fairq.App, job: int) -> int:
    (got,) = app.store.claim(WEIGHTED, queue="default", batch=1, worker="w-1")
    assert got.id == job
    return got.attempts


def test_a_job_page_tells_its_state(app: fairq.App) -> None:
    retried = app.enqueue("t", tenant="acme")
    attempt = claim(app, retried)
    running = page(app, retried)
    assert "held by" in running and "w-1" in running
    app.store.finish_failed([(retried, attempt, "boom: first try", 0.0)])
    attempt = claim(app, retried)
    app.store.finish_done([(retried, attempt)], ['{"ok": true}'])
    done = page(app, retried)
    assert "held by" not in done
    assert "An earlier attempt&#39;s error" in done and "boom: first try" in done
    assert done.index('id="result"') < done.index('id="last-error"')
    assert not re.search(r'class="[^"]*error-text[^"]*" id="last-error"', done)

    failed = app.enqueue("t", tenant="acme")
    attempt = claim(app, failed)
    app.store.finish_failed([(failed, attempt, "boom: for good", None)], final=[failed])
    shown = page(app, failed)
    assert "held by" not in shown
    assert re.search(r'class="card error-text" id="last-error">boom: for good', shown)
    assert shown.index('id="last-error"') < shown.index('id="payload"')  # the error first
