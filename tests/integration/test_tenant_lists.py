"""``fairq tenants list`` / ``groups list`` and the exporter's read, linear in tenants: the
values they show (configured tenants, tenants seen only in queues, several queues, groups, rate
limits, defaults), and at 100,000 tenants their time (slow: FAIRQ_SLOW=1)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry, generate_latest

import fairq
from fairq.cli import main
from fairq.metrics.exporter import DatabaseCollector
from fairq.models import GroupConfig, TenantConfig

slow = pytest.mark.skipif(os.environ.get("FAIRQ_SLOW") != "1",
                          reason="100,000 tenants: set FAIRQ_SLOW=1")


@pytest.fixture
def app(dsn: str) -> Iterator[fairq.App]:
    a = fairq.App(dsn, schema="fairq")
    yield a
    a.close()


def test_tenants_list_shows_every_tenant_once_with_its_effective_settings(
        app: fairq.App, dsn: str) -> None:
    app.store.set_tenants([], defaults=(2.0, 7))
    app.groups.set("gold", weight=3.0)
    app.tenants.set("configured", weight=5.0, max_running=3, rate=2.0, group="gold")
    app.tenants.set("idle", weight=0.5)  # configured, never seen in a queue
    for queue in ("q1", "q2"):
        app.enqueue("t", tenant="configured", queue=queue)
        app.enqueue("t", tenant="seen", queue=queue)
    with psycopg.connect(dsn) as c:  # running counts of two queues, summed
        c.execute("UPDATE fairq.tenant_schedule SET running = CASE queue WHEN 'q1' THEN 2 "
                  "ELSE 1 END")
    assert app.tenants.list() == [
        TenantConfig("configured", 5.0, 3, True, 3, 2.0, 2, "gold", version=1),
        TenantConfig("idle", 0.5, 7, True, 0, None, None, None, version=1),
        TenantConfig("seen", 2.0, 7, False, 3, None, None, None, version=0),
    ]
    # a group counts its configured tenants and those known only by their jobs ("seen")
    assert app.groups.list() == [GroupConfig("default", 1.0, False, 2),
                                 GroupConfig("gold", 3.0, True, 1)]
    app.groups.set("default", weight=0.5)
    assert app.groups.list()[0] == GroupConfig("default", 0.5, True, 2)


def test_tenants_list_with_no_tenants(app: fairq.App,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert app.tenants.list() == []
    assert app.groups.list() == [GroupConfig("default", 1.0, False, 0)]


def test_a_timed_out_exporter_query_is_named_in_its_log_line(
        app: fairq.App, dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    app.enqueue("t", tenant="a")
    collector = DatabaseCollector(dsn, "fairq", interval=0, statement_timeout_ms=100)
    try:
        with psycopg.connect(dsn) as locker, caplog.at_level(logging.WARNING, "fairq.exporter"):
            locker.execute("LOCK TABLE fairq.tenant_schedule IN ACCESS EXCLUSIVE MODE")
            assert collector.refresh() == []
        (line,) = [r.getMessage() for r in caplog.records if r.name == "fairq.exporter"]
        assert line.startswith("exporter query exporter_tenants failed: ")
        assert "\n" not in line
    finally:
        collector.close()


def many_tenants(dsn: str, n: int) -> None:
    """``n`` tenants with a queued job each, a thousand of them configured, and a whale with
    50,000 jobs: one INSERT ... generate_series per table, statistics never analyzed."""
    with psycopg.connect(dsn) as c:
        c.execute("INSERT INTO fairq.tenant_schedule (queue, tenant, running, vtime) "
                  "SELECT 'default', 't' || g, g %% 3, g * 0.001 FROM generate_series(1, %s) g",
                  (n,))
        c.execute("INSERT INTO fairq.tenants (tenant, weight, max_running) "
                  "SELECT 't' || g, 2, 5 FROM generate_series(1, %s, 100) g", (n,))
        c.execute("INSERT INTO fairq.jobs (tenant, task) "
                  "SELECT 't' || g, 't' FROM generate_series(1, %s) g", (n,))
        c.execute("INSERT INTO fairq.jobs (tenant, task) "
                  "SELECT 'whale', 't' FROM generate_series(1, 50000)")
        c.execute("INSERT INTO fairq.tenant_schedule (queue, tenant) VALUES ('default', 'whale')")


@slow
def test_tenants_list_at_100000_tenants_takes_seconds(
        dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    many_tenants(dsn, 100_000)
    started = time.monotonic()
    assert main(["--dsn", dsn, "tenants", "list"]) == 0
    took = time.monotonic() - started
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 + 100_001
    assert took < 10, took  # quadratic: cancelled by the 30 s statement timeout
    started = time.monotonic()
    assert main(["--dsn", dsn, "groups", "list"]) == 0
    assert time.monotonic() - started < 5


def test_a_scrape_waits_for_a_slow_refresh_only_so_long(
        app: fairq.App, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A refresh slower than ``scrape_wait``: the scrape serves the previous values at once,
    and the next scrape the new ones."""
    app.enqueue("t", tenant="a")
    collector = DatabaseCollector(dsn, "fairq", interval=0, scrape_wait=0.5)
    registry = CollectorRegistry()
    registry.register(collector)
    series = 'fairq_tenant_queued_jobs{queue="default",tenant="a"}'
    try:
        assert f"{series} 1.0" in generate_latest(registry).decode()
        query = collector._query
        release = threading.Event()

        def slow_query() -> Any:
            release.wait(10)
            return query()

        monkeypatch.setattr(collector, "_query", slow_query)
        app.enqueue("t", tenant="a")
        started = time.monotonic()
        assert f"{series} 1.0" in generate_latest(registry).decode()  # the previous values
        assert 0.4 < time.monotonic() - started < 2.0
        release.set()
        running = collector._refreshing
        if running is not None:
            running.join(10)
        monkeypatch.setattr(collector, "_query", query)
        text = generate_latest(registry).decode()
        assert f"{series} 2.0" in text
    finally:
        release.set()
        collector.close()


@slow
def test_exporter_scrape_at_100000_tenants(dsn: str) -> None:
    many_tenants(dsn, 100_000)
    collector = DatabaseCollector(dsn, "fairq", interval=0)
    registry = CollectorRegistry()
    registry.register(collector)
    try:
        refreshes, scrapes = [], []
        for _ in range(3):
            started = time.monotonic()
            assert collector.refresh() and collector._up == 1.0
            refreshes.append(time.monotonic() - started)
        generate_latest(registry)  # the first scrape waits for the first refresh
        for _ in range(3):
            started = time.monotonic()
            assert b"fairq_tenant_queued_jobs" in generate_latest(registry)
            scrapes.append(time.monotonic() - started)
        print(f"refresh at 100,000 tenants: {refreshes}; scrape: {scrapes}")
        assert max(scrapes) < 2.0, scrapes
        assert min(refreshes) < 5.0, refreshes  # 3-9.5 s before, under the same load
    finally:
        collector.close()


def test_the_exporter_keeps_about_eleven_snapshots_per_window() -> None:
    """One snapshot of every tenant's claims per refresh was ~20 MB each at 100,000 tenants,
    61 of them with the defaults; one every tenth of the window at most, and the claims are
    still counted from the window's start (here: all of them, from the first snapshot)."""
    from fairq.metrics.exporter_rows import TenantRow

    collector = DatabaseCollector("postgresql://unused", "fairq", interval=0, window=100.0)
    for second in range(301):
        row = TenantRow("q", "a", 1.0, 10, 0, second, 1, 1, 0.0, effective_weight=1.0)
        claims = collector._window_claims([row], float(second))
    assert len(collector._snapshots) <= 12
    assert 100 <= claims[("q", "a")] <= 110  # the window, and at most a tenth more
