"""Claim planning vs execution: the sampled EXPLAIN probe on a server without pg_stat_statements,
and pg_stat_statements on a private cluster that preloads it (with and without track_planning)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import psycopg
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from fairq import migrate
from fairq.metrics.probe import PGSS, SAMPLED, ClaimProbe, statement_prefix
from fairq.policies import get_policy
from fairq.store import Store
from tests.support import pgcluster
from tests.support.observability import enqueue, promtool_check, samples


def registry_for(probe: ClaimProbe) -> CollectorRegistry:
    r = CollectorRegistry()
    r.register(probe)
    return r


def test_sampled_probe_without_pg_stat_statements(store: Store, dsn: str) -> None:
    enqueue(store, "acme", 20)
    probe = ClaimProbe(dsn, "fairq", ["weighted", "fifo"], interval=3600)
    try:
        registry = registry_for(probe)
        v = samples(registry)
        assert probe.source == SAMPLED
        assert v[f"fairq_claim_probe_info{{source={SAMPLED}}}"] == 1
        for policy in ("weighted", "fifo"):
            assert v[f"fairq_claim_planning_seconds_count{{policy={policy}}}"] == 1
            assert v[f"fairq_claim_execution_seconds_sum{{policy={policy}}}"] > 0
            # planned as a worker's session plans it: one generic plan, kept
            assert v[f"fairq_claim_replan_ratio{{policy={policy}}}"] == 0.0
        # Rate-limited: another scrape within the interval does not probe again.
        assert samples(registry)["fairq_claim_planning_seconds_count{policy=weighted}"] == 1
        text = generate_latest(registry).decode()
        assert "EXPLAIN ANALYZE sampled every 3600s" in text
        promtool_check(text.encode())
        for _ in range(7):
            probe.refresh(force=True)
        # The normal value stays 0: the plan is reused, never planned afresh per execution.
        assert samples(registry)["fairq_claim_replan_ratio{policy=weighted}"] == 0.0
    finally:
        probe.close()
    # The probe rolled back: nothing was claimed, no tenant slot is taken.
    jobs = store.claim(get_policy("weighted"), queue="default", batch=50, worker="w")
    assert len(jobs) == 10  # the tenant's default cap, all of its jobs still queued


@pytest.fixture(scope="module")
def pgss_cluster(tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[Callable[[bool], str]]:
    if not pgcluster.available():
        pytest.skip("PostgreSQL server binaries not found")
    clusters: dict[bool, pgcluster.Cluster] = {}

    def get(track_planning: bool) -> str:
        if track_planning not in clusters:
            c = pgcluster.start(tmp_path_factory.mktemp("pgss"), options={
                "shared_preload_libraries": "pg_stat_statements",
                "pg_stat_statements.track_planning": "on" if track_planning else "off"})
            clusters[track_planning] = c
            with psycopg.connect(c.dsn, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION pg_stat_statements")
            migrate.upgrade(c.dsn, "fairq")
        return clusters[track_planning].dsn

    yield get
    for c in clusters.values():
        c.remove()


@pytest.mark.cluster
def test_pg_stat_statements_source(pgss_cluster: Callable[[bool], str]) -> None:
    dsn = pgss_cluster(True)
    store = Store(dsn, "fairq")
    store.pool.wait()
    probe = ClaimProbe(dsn, "fairq", ["weighted", "fifo"], pgss_every=0)
    try:
        registry = registry_for(probe)
        before = samples(registry)
        assert probe.source == PGSS
        assert before[f"fairq_claim_probe_info{{source={PGSS}}}"] == 1
        enqueue(store, "acme", 30)
        for _ in range(12):
            store.claim(get_policy("weighted"), queue="default", batch=1, worker="w")
        store.claim(get_policy("fifo"), queue="default", batch=1, worker="w")
        v = samples(registry)
        calls = v["fairq_claim_execution_seconds_count{policy=weighted}"] - before.get(
            "fairq_claim_execution_seconds_count{policy=weighted}", 0)
        # 12 claims; a short claim_fair is followed by its fallback statement, counted too.
        assert 12 <= calls <= 24
        assert v["fairq_claim_execution_seconds_count{policy=fifo}"] >= 1
        assert v["fairq_claim_planning_seconds_count{policy=weighted}"] >= 1
        assert v["fairq_claim_planning_seconds_sum{policy=weighted}"] > 0
        assert 0 < v["fairq_claim_replan_ratio{policy=weighted}"] <= 1
        with psycopg.connect(dsn, autocommit=True) as conn:  # the ratio is plans / calls
            row = conn.execute(
                "SELECT sum(plans), sum(calls) FROM pg_stat_statements "
                "WHERE starts_with(query, %s)",
                (statement_prefix("claim_fair", "fairq"),)).fetchone()
        assert row is not None and row[1] >= 12
        text = generate_latest(registry).decode()
        assert "source: pg_stat_statements" in text
        promtool_check(text.encode())
    finally:
        probe.close()
        store.close()


@pytest.mark.cluster
def test_pg_stat_statements_without_track_planning_falls_back(
        pgss_cluster: Callable[[bool], str]) -> None:
    dsn = pgss_cluster(False)
    probe = ClaimProbe(dsn, "fairq", ["weighted"])
    try:
        text = generate_latest(registry_for(probe)).decode()
        assert probe.source == SAMPLED
        assert "track_planning is off" in text
        assert f'fairq_claim_probe_info{{source="{SAMPLED}"}} 1.0' in text
    finally:
        probe.close()


def test_statement_prefix_names_the_schema() -> None:
    assert '"fairq".claim_fair(' in statement_prefix("claim_fair", "fairq")
    assert '"other".jobs' in statement_prefix("claim_fifo", "other")
    assert "%(" not in statement_prefix("claim_fair", "fairq")
