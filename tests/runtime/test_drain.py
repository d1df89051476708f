"""When ``run(until_empty=True)`` ends: not while a due job waits only for its tenant's next
token (time alone makes it claimable), but regardless of delayed jobs, capped or paused tenants.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

import fairq
from fairq.policies import get_policy
from fairq.store import Store
from tests.support.fairtools import fill, sql_rows

SCHEMA = "fairq"


@pytest.fixture
def app(dsn: str) -> Iterator[fairq.App]:
    a = fairq.App(dsn, schema=SCHEMA)
    yield a
    a.close()


def statuses(dsn: str) -> dict[tuple[str, str], int]:
    return {(t, s): n for t, s, n in sql_rows(
        dsn, "SELECT tenant, status, count(*) FROM fairq.jobs GROUP BY 1, 2")}


@pytest.mark.parametrize("policy", ["fifo", "weighted"])
def test_until_empty_waits_for_a_rate_limited_tenants_tokens(app: fairq.App, dsn: str,
                                                              policy: str) -> None:
    """30 jobs at 20/s with a bucket of one: all of them run, one per token. The poll interval
    is an hour, so only the wake-up at the next token can bring each claim (a worker that
    ended here used to leave 29 queued)."""
    app.tenants.set("acme", rate=20.0, burst=1)
    seen: list[int] = []
    lock = threading.Lock()

    @app.task(name="t")
    def t(job: fairq.Job) -> None:
        with lock:
            seen.append(job.id)

    app.enqueue_many("t", [("acme", {})] * 30)
    w = app.worker(policy=policy, concurrency=4, listen=False, poll_interval=3600.0)
    w.run(until_empty=True)  # returns by itself
    assert statuses(dsn) == {("acme", "done"): 30}
    assert len(seen) == len(set(seen)) == 30
    # It slept until each token instead of turning: one claim per token and a few more.
    # Spinning (a wake-up at once, every turn) would take thousands of turns for 1.5 s.
    assert w.stats.loops < 1000, w.stats.loops


def test_until_empty_ends_with_only_delayed_capped_or_paused_jobs(app: fairq.App, dsn: str,
                                                                  store: Store) -> None:
    """Rate-limited tenants all, each kept from its job by something other than its tokens:
    a job an hour ahead, a cap reached by a job running elsewhere, a pause (cap 0)."""
    for tenant in ("later", "capped", "paused"):
        app.tenants.set(tenant, rate=20.0, burst=1)
    app.tenants.set("capped", max_running=1)
    app.tenants.set("paused", max_running=0)

    @app.task(name="t")
    def t(job: fairq.Job) -> None:
        pass

    app.enqueue("t", tenant="later", delay=3600.0)
    app.enqueue_many("t", [("capped", {})] * 2 + [("paused", {})])
    (elsewhere,) = store.claim(get_policy("fifo"), queue="default", batch=1, worker="elsewhere")
    assert elsewhere.tenant == "capped"
    assert store.next_token(["default"]) is None
    w = app.worker(policy="weighted", concurrency=2, listen=False, poll_interval=3600.0)
    w.run(until_empty=True)  # returns by itself, though every tenant there has a rate limit
    assert w.stats.claimed == 0
    assert statuses(dsn) == {("later", "queued"): 1, ("capped", "running"): 1,
                             ("capped", "queued"): 1, ("paused", "queued"): 1}


def test_next_token_is_the_wait_for_a_dry_tenant_with_a_due_job(app: fairq.App,
                                                                store: Store) -> None:
    """The store's answer: None without a rate-limited tenant waiting with a due job, else the
    seconds to its next token (at most 1/rate), 0 once the token is there."""
    assert store.next_token(["default"]) is None
    app.tenants.set("acme", rate=0.5, burst=1)
    fill(store, {"acme": 3, "free": 1})
    assert store.next_token(["other"]) is None
    wait = store.next_token(["default"])
    assert wait == 0.0  # a full bucket: claimable now
    jobs = store.claim(get_policy("weighted"), queue="default", batch=10, worker="w")
    assert sorted(j.tenant for j in jobs) == ["acme", "free"]
    wait = store.next_token(["default", "other"])
    assert wait is not None and 0.0 < wait <= 2.0
