"""Worker metrics: the tenant fold (bounded, no stale series, monotonic counters), exposition that
promtool accepts, and /healthz following the worker loop and the database."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from fairq.metrics import OTHER, PrometheusObserver, all_of, db_check, serve
from fairq.models import ClaimedJob
from tests.support import pgcluster
from tests.support.observability import fetch, promtool_check, samples

TENANT_FAMILIES = ("fairq_jobs_enqueued", "fairq_jobs_claimed", "fairq_jobs_finished",
                   "fairq_job_wait_seconds", "fairq_job_run_seconds")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def job(tenant: str, wait: float = 0.5, queue: str = "default", task: str = "t") -> ClaimedJob:
    started = datetime(2024, 1, 1, tzinfo=UTC)
    return ClaimedJob(id=1, queue=queue, tenant=tenant, task=task, payload={}, attempts=1,
                      max_attempts=5, lease_seconds=30, priority=0, cost=1.0,
                      run_at=started - timedelta(seconds=wait), started_at=started,
                      locked_until=started + timedelta(seconds=30))


def activity(obs: PrometheusObserver, tenant: str, n: int = 1) -> None:
    obs.on_enqueue("default", tenant, n)
    jobs = [job(tenant) for _ in range(n)]
    obs.on_claim("default", "weighted", "claimed", 0.002, jobs)
    for j in jobs:
        obs.on_finish(j, "done", 0.01)


def tenants_by_family(registry: CollectorRegistry) -> dict[str, set[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    for fam in registry.collect():
        for s in fam.samples:
            if "tenant" in s.labels:
                found[fam.name].add(s.labels["tenant"])
    return found


def test_fold_keeps_at_most_n_plus_one_series_per_family() -> None:
    clock = Clock()
    obs = PrometheusObserver(CollectorRegistry(), max_tenants=5, clock=clock)
    for i in range(100):
        activity(obs, f"tenant-{i:03d}", n=1 + i % 3)
    found = tenants_by_family(obs.registry)
    assert set(found) == set(TENANT_FAMILIES)
    for name, tenants in found.items():
        assert len(tenants) <= 6, (name, tenants)
        assert OTHER in tenants
    values = samples(obs.registry)
    assert values["fairq_metrics_tenants_folded{}"] == 95
    # Nothing is lost: the folded series carry the rest of the counts.
    total = sum(v for k, v in values.items() if k.startswith("fairq_jobs_claimed_total{"))
    assert total == sum(1 + i % 3 for i in range(100))


def test_rerank_drops_stale_tenants_and_counters_stay_monotonic() -> None:
    clock = Clock()
    obs = PrometheusObserver(CollectorRegistry(), max_tenants=3, rerank_seconds=60, clock=clock)
    rng = random.Random(5)
    previous: dict[str, float] = {}
    seen_live: set[str] = set()
    for round_ in range(30):
        # A shifting hot set: each round a different few tenants dominate.
        hot = [f"t{(round_ * 2 + k) % 12}" for k in range(3)]
        for _ in range(50):
            tenant = rng.choice(hot) if rng.random() < 0.9 else f"t{rng.randrange(12)}"
            activity(obs, tenant)
        clock.now += 61
        current = samples(obs.registry)
        for key, value in current.items():
            monotonic = "_total{" in key or "_count{" in key or "_bucket{" in key
            if monotonic and key in previous:
                assert value >= previous[key], f"{key} went down: {previous[key]} -> {value}"
        for tenants in tenants_by_family(obs.registry).values():
            assert len(tenants) <= 4
            seen_live |= tenants
        previous = current
    assert len(seen_live) > 4, "the top set should have moved"
    # Hot tenants of the last round own their series; early hot ones have been dropped.
    claimed = tenants_by_family(obs.registry)["fairq_jobs_claimed"]
    assert {"t10", "t11"} & claimed
    # Everything goes quiet: idle tenants' series disappear after their scores decay.
    for _ in range(12):
        clock.now += 61
        obs.rerank_now()
    assert tenants_by_family(obs.registry)["fairq_jobs_claimed"] <= {OTHER}
    assert samples(obs.registry)["fairq_metrics_tenants_folded{}"] == 0


def test_env_sets_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAIRQ_METRICS_MAX_TENANTS", "2")
    obs = PrometheusObserver(CollectorRegistry())
    for t in "abcde":
        activity(obs, t)
    assert tenants_by_family(obs.registry)["fairq_jobs_claimed"] == {"a", "b", OTHER}


def test_claim_results_and_leases() -> None:
    obs = PrometheusObserver(CollectorRegistry(), max_tenants=10)
    obs.on_claim("q1", "fifo", "empty", 0.001, [])
    obs.on_claim("q1", "fifo", "error", 0.5, [])
    obs.on_claim("q1", "fifo", "claimed", 0.003, [job("a", wait=12.0, queue="q1")])
    obs.on_reap("q1", 3)
    first = samples(obs.registry)  # a tenant's new series are shown at 0 once (fresh_series)
    assert first["fairq_job_wait_seconds_count{queue=q1,tenant=a}"] == 0
    v = samples(obs.registry)
    for result in ("empty", "error", "claimed"):
        assert v[f"fairq_claim_seconds_count{{policy=fifo,queue=q1,result={result}}}"] == 1
    assert v["fairq_leases_expired_total{queue=q1}"] == 3
    assert v["fairq_job_wait_seconds_sum{queue=q1,tenant=a}"] == pytest.approx(12.0)
    assert v["fairq_job_wait_seconds_bucket{le=10.0,queue=q1,tenant=a}"] == 0
    assert v["fairq_job_wait_seconds_bucket{le=30.0,queue=q1,tenant=a}"] == 1


@pytest.fixture
def observer() -> Iterator[PrometheusObserver]:
    obs = PrometheusObserver(max_tenants=3)  # with process/platform/GC collectors, as served
    yield obs
    if obs.server is not None:
        obs.server.close()


def test_metrics_endpoint_passes_promtool(observer: PrometheusObserver) -> None:
    for i in range(8):
        activity(observer, f"tenant{i}", n=2)
    observer.on_claim("default", "weighted", "empty", 0.001, [])
    observer.on_reap("default", 1)
    observer.on_loop(True)
    server = observer.serve(0, "127.0.0.1")
    status, body = fetch(f"{server.url}/metrics")
    assert status == 200
    assert b'fairq_jobs_claimed_total{policy="weighted",queue="default",tenant="__other__"}' \
        in body
    promtool_check(body)
    assert fetch(f"{server.url}/nope")[0] == 404


def test_healthz_follows_the_worker_loop() -> None:
    clock = Clock()
    obs = PrometheusObserver(CollectorRegistry(), max_tenants=3, stale_after=10, clock=clock)
    server = obs.serve(0, "127.0.0.1")
    try:
        assert fetch(f"{server.url}/healthz")[0] == 503  # never ticked
        obs.on_loop(True)
        assert fetch(f"{server.url}/healthz") == (200, b"ok\n")
        obs.on_loop(False)  # the loop says its database is unreachable
        assert fetch(f"{server.url}/healthz")[0] == 503
        obs.on_loop(True)
        clock.now += 11  # loop stuck
        assert fetch(f"{server.url}/healthz")[0] == 503
    finally:
        server.close()


@pytest.mark.cluster
@pytest.mark.skipif(not pgcluster.available(), reason="PostgreSQL server binaries not found")
def test_healthz_turns_unhealthy_when_the_database_is_gone(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    cluster = pgcluster.start(tmp_path)
    request.addfinalizer(cluster.remove)
    obs = PrometheusObserver(CollectorRegistry(), max_tenants=3)
    obs.on_loop(True)
    server = serve(0, "127.0.0.1", health=all_of(obs.loop_healthy,
                                                  db_check(cluster.dsn, cache_seconds=0)),
                   registry=obs.registry)
    request.addfinalizer(server.close)
    assert fetch(f"{server.url}/healthz")[0] == 200
    cluster.stop()
    obs.on_loop(True)  # the loop still ticks: the database check alone must fail
    assert fetch(f"{server.url}/healthz")[0] == 503
    # /metrics keeps answering while unhealthy (scrapes show what happened).
    assert fetch(f"{server.url}/metrics")[0] == 200


def test_a_new_tenants_first_waits_show_as_an_increase() -> None:
    """Its series appear at 0 first, then with the burst: rate() sees the burst."""
    obs = PrometheusObserver(CollectorRegistry(), max_tenants=10)
    obs.on_claim("q", "weighted", "claimed", 0.001, [job("big", wait=0.1, queue="q")])
    samples(obs.registry)
    before = samples(obs.registry)
    assert before["fairq_job_wait_seconds_count{queue=q,tenant=big}"] == 1
    obs.on_claim("q", "weighted", "claimed", 0.001,
                 [job("small", wait=2.0, queue="q") for _ in range(5)])
    obs.on_enqueue("q", "small", 5)
    first = samples(obs.registry)
    assert first["fairq_job_wait_seconds_count{queue=q,tenant=small}"] == 0
    assert first["fairq_jobs_claimed_total{policy=weighted,queue=q,tenant=small}"] == 0
    assert first["fairq_jobs_enqueued_total{queue=q,tenant=small}"] == 0
    assert first["fairq_job_wait_seconds_count{queue=q,tenant=big}"] == 1  # old series unchanged
    second = samples(obs.registry)
    assert second["fairq_job_wait_seconds_count{queue=q,tenant=small}"] == 5
    assert second["fairq_job_wait_seconds_bucket{le=2.5,queue=q,tenant=small}"] == 5
    assert second["fairq_jobs_claimed_total{policy=weighted,queue=q,tenant=small}"] == 5
    assert second["fairq_claim_seconds_count{policy=weighted,queue=q,result=claimed}"] == 2


def test_task_and_queue_labels_are_folded_like_tenants() -> None:
    """Unknown task names and many queues make at most limit + 1 label values each: 3,000
    names make no more series than 300."""

    def run(names: int) -> tuple[set[str], set[str], int, dict[str, float]]:
        obs = PrometheusObserver(CollectorRegistry(), max_tenants=5, clock=Clock())
        for i in range(names):
            j = job("acme", queue=f"q{i % (names * 2 // 3):04d}", task=f"unknown-task-{i:04d}")
            obs.on_enqueue(j.queue, "acme", 1)
            obs.on_claim(j.queue, "weighted", "claimed", 0.002, [j])
            obs.on_finish(j, "done", 0.01)
            obs.on_reap(j.queue, 1)
        tasks: set[str] = set()
        queues: set[str] = set()
        series = 0
        for fam in obs.registry.collect():
            for s in fam.samples:
                series += fam.name.startswith("fairq_")
                tasks.update([s.labels["task"]] if "task" in s.labels else [])
                queues.update([s.labels["queue"]] if "queue" in s.labels else [])
        values = samples(obs.registry)
        obs.rerank_now()  # a re-rank keeps them bounded too
        assert len({s.labels["task"] for fam in obs.registry.collect() for s in fam.samples
                    if "task" in s.labels}) <= 6
        return tasks, queues, series, values

    tasks, queues, series, values = run(300)
    assert len(tasks) <= 6 and OTHER in tasks
    assert len(queues) <= 6 and OTHER in queues
    assert run(3000)[2] == series
    # Nothing is lost: the folded series carry the rest.
    assert sum(v for k, v in values.items() if k.startswith("fairq_jobs_claimed_total{")) == 300
    assert sum(v for k, v in values.items() if k.startswith("fairq_leases_expired_total{")) == 300
    assert sum(v for k, v in values.items()
               if k.startswith("fairq_job_run_seconds_count{")) == 300
