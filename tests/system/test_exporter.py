"""The database exporter: values against a known database state, the tenant fold, fairness from
claimed_total deltas, error handling under a dead database, and promtool on its output."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import psycopg
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from fairq.metrics.exporter import DatabaseCollector, build_registry
from fairq.metrics.exporter_rows import TenantRow, fairness, keep_queues, keep_tenants
from fairq.models import GroupConfig, TenantConfig
from fairq.policies import get_policy
from fairq.store import Store
from tests.support.observability import enqueue, fetch, promtool_check, samples
from tests.support.paths import REPO
from tests.support.prom import free_port

ROOT = REPO


def claim(store: Store, n: int, policy: str = "weighted") -> int:
    got = 0
    while got < n:
        jobs = store.claim(get_policy(policy), queue="default", batch=min(10, n - got), worker="w")
        if not jobs:
            break
        got += len(jobs)
        store.finish_done([(j.id, j.attempts) for j in jobs])
    return got


@pytest.fixture
def collector(dsn: str) -> Iterator[DatabaseCollector]:
    c = DatabaseCollector(dsn, "fairq", max_tenants=50, interval=0, window=300)
    yield c
    c.close()


def reg(c: DatabaseCollector) -> CollectorRegistry:
    r = CollectorRegistry()
    r.register(c)
    return r


def test_gauges_match_the_database(store: Store, collector: DatabaseCollector, dsn: str) -> None:
    store.set_tenants([TenantConfig("acme", 3.0, 20), TenantConfig("globex", 1.0, 0)])
    enqueue(store, "acme", 7)
    enqueue(store, "globex", 4)
    enqueue(store, "initech", 2, delay=3600)
    with psycopg.connect(dsn, autocommit=True) as conn:  # acme's jobs became due 30s ago
        conn.execute("UPDATE fairq.jobs SET run_at = now() - interval '30 seconds' "
                     "WHERE tenant = 'acme'")
    registry = reg(collector)
    jobs = store.claim(get_policy("weighted"), queue="default", batch=2, worker="w")
    assert {j.tenant for j in jobs} == {"acme"}
    with psycopg.connect(dsn, autocommit=True) as conn:  # one lease expired, not yet reaped
        conn.execute("UPDATE fairq.jobs SET locked_until = now() - interval '1 second' "
                     "WHERE id = %s", (jobs[0].id,))
    v = samples(registry)
    assert v["fairq_tenant_queued_jobs{queue=default,tenant=acme}"] == 5
    assert v["fairq_tenant_queued_jobs{queue=default,tenant=initech}"] == 2
    assert v["fairq_tenant_running_jobs{queue=default,tenant=acme}"] == 2
    assert v["fairq_tenant_max_running{tenant=acme}"] == 20
    assert v["fairq_tenant_max_running{tenant=globex}"] == 0
    assert v["fairq_tenant_weight{tenant=acme}"] == 3.0
    assert 29 <= v["fairq_oldest_runnable_job_age_seconds{queue=default,tenant=acme}"] < 60
    assert v["fairq_oldest_runnable_job_age_seconds{queue=default,tenant=initech}"] == 0
    assert v["fairq_leases_expired_unreaped_jobs{queue=default}"] == 1
    assert "fairq_jobs_dead_tuples{}" in v
    assert "fairq_jobs_last_autovacuum_timestamp_seconds{}" in v
    assert v["fairq_metrics_tenants_folded{}"] == 0
    assert v["fairq_exporter_up{}"] == 1


def test_fairness_over_the_window(store: Store, collector: DatabaseCollector) -> None:
    store.set_tenants([TenantConfig("a", 2.0, 100), TenantConfig("b", 1.0, 100),
                       TenantConfig("c", 1.0, 100)])
    for t in "abc":
        enqueue(store, t, 200)
    registry = reg(collector)
    samples(registry)  # baseline snapshot
    assert claim(store, 80, "weighted") == 80
    v = samples(registry)
    assert v["fairq_fairness_jain_index{queue=default}"] > 0.95
    assert v["fairq_fairness_max_share_error{queue=default}"] < 0.05
    claim(store, 60, "fifo")  # fifo serves a's backlog first (enqueued first): unfair
    v = samples(registry)
    assert v["fairq_fairness_jain_index{queue=default}"] < 0.9
    assert v["fairq_fairness_max_share_error{queue=default}"] > 0.1


def test_fairness_maths() -> None:
    def row(t: str, w: float, runnable: int = 5) -> TenantRow:  # no groups: weight as is
        return TenantRow("q", t, w, 10, 0, 0, runnable, runnable, 1.0,
                         effective_weight=w if runnable else None)

    rows = [row("a", 2.0), row("b", 1.0), row("idle", 1.0, runnable=0)]
    jain, err = fairness(rows, {("q", "a"): 20, ("q", "b"): 10, ("q", "idle"): 0})["q"]
    assert jain == pytest.approx(1.0) and err == pytest.approx(0.0)  # idle tenant excluded
    jain, err = fairness(rows, {("q", "a"): 10, ("q", "b"): 10})["q"]
    assert jain < 1.0 and err == pytest.approx(1 / 6)


def test_keep_tenants_favours_waiting_then_backlog() -> None:
    rows = [TenantRow("q", f"big{i}", 1, 10, 0, 0, 1000 - i, 1000 - i, 1.0) for i in range(6)]
    rows.append(TenantRow("q", "starving", 1, 10, 0, 0, 1, 1, 900.0))
    kept = keep_tenants(rows, 4)
    assert len(kept) == 4 and "starving" in kept and {"big0", "big1"} <= kept


def test_fold_in_the_exporter(store: Store, dsn: str) -> None:
    for i in range(12):
        enqueue(store, f"t{i:02d}", i + 1)
    c = DatabaseCollector(dsn, "fairq", max_tenants=4, interval=0)
    try:
        registry = reg(c)
        v = samples(registry)
        queued = {k: x for k, x in v.items() if k.startswith("fairq_tenant_queued_jobs{")}
        assert len(queued) == 5
        # Two slots by oldest wait (t00 and t01 were enqueued first), two by backlog.
        kept = {"t00": 1, "t01": 2, "t10": 11, "t11": 12}
        for t, n in kept.items():
            assert queued[f"fairq_tenant_queued_jobs{{queue=default,tenant={t}}}"] == n
        other = queued["fairq_tenant_queued_jobs{queue=default,tenant=__other__}"]
        assert other == sum(range(1, 13)) - sum(kept.values())
        assert v["fairq_metrics_tenants_folded{}"] == 8
        assert not any("__other__" in k for k in v if k.startswith("fairq_tenant_weight"))
        # The backlog moves: the folded tenants' series go, no stale ones stay.
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM fairq.jobs WHERE tenant >= 't08'")
        enqueue(store, "t00", 50)
        tenants = {k.split("tenant=")[1].rstrip("}") for k in samples(registry)
                   if k.startswith("fairq_tenant_queued_jobs{")}
        assert "t00" in tenants and "t11" not in tenants and len(tenants) == 5
    finally:
        c.close()


def test_queue_label_is_folded_in_the_exporter(store: Store, dsn: str) -> None:
    for i in range(12):
        enqueue(store, "acme", i + 1, queue=f"q{i:02d}")
    c = DatabaseCollector(dsn, "fairq", max_tenants=4, interval=0)
    try:
        v = samples(reg(c))
        queues = {k.split("queue=")[1].split(",")[0].rstrip("}") for k in v if "queue=" in k}
        assert queues == {"q08", "q09", "q10", "q11", "__other__"}  # the largest four
        queued = {k: x for k, x in v.items() if k.startswith("fairq_tenant_queued_jobs{")}
        assert queued["fairq_tenant_queued_jobs{queue=__other__,tenant=acme}"] == sum(range(1, 9))
        assert not any("__other__" in k for k in v if k.startswith("fairq_fairness_"))
    finally:
        c.close()
    row = TenantRow("q", "t", 1.0, 10, 0, 0, 5, 5, 1.0)
    assert keep_queues([row], {"z": 3}, 1) == {"q"}
    assert keep_queues([row], {"z": 30}, 1) == {"z"}


def test_exporter_binds_localhost_by_default_and_logs_the_real_address(
        store: Store, dsn: str) -> None:
    from fairq.cli.exporter import DEFAULT_HOST

    assert DEFAULT_HOST == "127.0.0.1"
    for host_args, shown in (([], "127.0.0.1"), (["--host", "0.0.0.0"], "0.0.0.0")):
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "fairq", "--dsn", dsn, "exporter", "--port", str(port),
             "--no-probe", *host_args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, text=True,
        )
        try:
            assert proc.stderr is not None
            line = proc.stderr.readline()  # the ready line, once the socket is bound
            assert f"serving http://{shown}:{port}/metrics" in line, line
            out = subprocess.run(  # what the kernel says is listening
                ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True,
                check=False).stdout
            if out:  # ss may be missing: the log line above is then the evidence
                assert f"{shown}:{port}" in out, out
        finally:
            proc.terminate()
            assert proc.wait(timeout=15) == 0


def test_interval_caches_between_scrapes(store: Store, dsn: str) -> None:
    c = DatabaseCollector(dsn, "fairq", interval=3600)
    try:
        registry = reg(c)
        enqueue(store, "a", 1)
        assert samples(registry)["fairq_tenant_queued_jobs{queue=default,tenant=a}"] == 1
        enqueue(store, "a", 1)
        assert samples(registry)["fairq_tenant_queued_jobs{queue=default,tenant=a}"] == 1
    finally:
        c.close()


def test_database_errors_are_reported_not_raised(dsn: str) -> None:
    c = DatabaseCollector(dsn.replace("dbname=fairq_t", "dbname=no_such_db"), "fairq",
                          interval=0)
    v = samples(reg(c))
    assert v["fairq_exporter_up{}"] == 0 and v["fairq_exporter_errors_total{}"] == 1
    assert not any(k.startswith("fairq_tenant_") for k in v)


def test_statement_timeout_applies(store: Store, dsn: str) -> None:
    enqueue(store, "a", 1)
    c = DatabaseCollector(dsn, "fairq", interval=0, statement_timeout_ms=50)
    try:
        with psycopg.connect(dsn) as locker:  # an ACCESS EXCLUSIVE lock: reads must give up
            locker.execute("LOCK TABLE fairq.tenant_schedule IN ACCESS EXCLUSIVE MODE")
            started = time.monotonic()
            v = samples(reg(c))
            assert time.monotonic() - started < 5
            assert v["fairq_exporter_up{}"] == 0
    finally:
        c.close()


def test_exporter_output_passes_promtool(store: Store, dsn: str) -> None:
    store.set_tenants([TenantConfig("acme", 3.0, 20)])
    for t in ("acme", "globex", "initech"):
        enqueue(store, t, 5)
    claim(store, 6)
    registry = build_registry(dsn, "fairq", interval=0, probe_interval=1)
    first = generate_latest(registry)
    body = generate_latest(registry)
    assert b"fairq_claim_planning_seconds_count" in body  # before promtool, which may skip
    promtool_check(first)
    promtool_check(body)


def test_fairq_exporter_command_serves_metrics_and_health(store: Store, dsn: str) -> None:
    enqueue(store, "acme", 3)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "fairq", "--dsn", dsn, "exporter", "--port", str(port),
         "--host", "127.0.0.1", "--interval", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                status, body = fetch(f"http://127.0.0.1:{port}/metrics")
                break
            except OSError as exc:
                if time.monotonic() > deadline or proc.poll() is not None:
                    err = proc.stderr.read().decode() if proc.stderr else ""
                    raise AssertionError(err) from exc
                time.sleep(0.1)
        assert status == 200
        assert b'fairq_tenant_queued_jobs{queue="default",tenant="acme"} 3.0' in body
        assert fetch(f"http://127.0.0.1:{port}/healthz")[0] == 200
        promtool_check(body)
    finally:
        proc.terminate()
        assert proc.wait(timeout=15) == 0


def test_effective_weights_come_from_the_database(store: Store,
                                                  collector: DatabaseCollector) -> None:
    """Each backlogged tenant's weight times its group's factor over the queue's backlogged
    tenants of the group (effective_weight); none for a tenant with nothing runnable."""
    store.set_group(GroupConfig("gold", 3.0))
    store.set_tenants([TenantConfig("a", 2.0, 10, group="gold"),
                       TenantConfig("b", 1.0, 10, group="gold"),
                       TenantConfig("later", 4.0, 10, group="gold"),
                       TenantConfig("c", 0.5, 10)])
    for t in ("a", "b", "c"):
        enqueue(store, t, 2)
    enqueue(store, "later", 2, delay=3600)  # nothing runnable: not backlogged
    rows, _, _, _ = collector._query()
    weights = {r.tenant: r.effective_weight for r in rows}
    assert weights["later"] is None
    assert weights["a"] == pytest.approx(2.0 * 3.0 / 3.0)
    assert weights["b"] == pytest.approx(1.0 * 3.0 / 3.0)
    assert weights["c"] == pytest.approx(0.5 * 1.0 / 0.5)


def test_tenants_waiting_counts_each_queues_tenants_by_reason(
        store: Store, collector: DatabaseCollector) -> None:
    """fairq_tenants_waiting{queue, reason}: the reasons of `tenants explain`, counted; every
    reason but no_jobs has a series (0 included), and no tenant label."""
    from fairq.models import WAIT_REASONS
    from fairq.store.workers import register_worker

    registry = reg(collector)
    store.set_tenants([TenantConfig("capped", 1.0, 0)])
    enqueue(store, "capped", 1)
    enqueue(store, "later", 1, delay=3600)
    enqueue(store, "unserved", 1, queue="mail")
    for t in ("a", "b"):
        enqueue(store, t, 2)
    v = samples(registry)
    assert v["fairq_tenants_waiting{queue=default,reason=no_worker}"] == 4
    register_worker(store, "w1", queues=["default"], policy="weighted", beat_seconds=60)
    assert claim(store, 1) == 1  # a served, finished: b is ahead of it
    v = samples(registry)
    waiting = {k: x for k, x in v.items() if k.startswith("fairq_tenants_waiting{")}
    assert waiting == {
        **{f"fairq_tenants_waiting{{queue={q},reason={r}}}": 0.0
           for q in ("default", "mail") for r in WAIT_REASONS[1:]},
        "fairq_tenants_waiting{queue=default,reason=at_cap}": 1.0,
        "fairq_tenants_waiting{queue=default,reason=no_due_jobs}": 1.0,
        "fairq_tenants_waiting{queue=default,reason=waiting_turn}": 2.0,
        "fairq_tenants_waiting{queue=mail,reason=no_worker}": 1.0,
    }
