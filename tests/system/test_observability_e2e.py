"""End to end: a real Prometheus scrapes a live `fairq worker --metrics-port`, `fairq exporter`
and a producer while jobs of three tenants flow; then every PromQL expression of every dashboard
panel and every alert rule must parse and return data through the Prometheus HTTP API."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fairq.app import App
from fairq.metrics import PrometheusObserver
from tests.support.observability import DASHBOARDS, SUBSTITUTIONS, UIDS, alert_exprs
from tests.support.paths import REPO
from tests.support.prom import (
    PromQLError,
    dashboard_exprs,
    free_port,
    prometheus_binary,
    start_prometheus,
    without_thresholds,
)

ROOT = REPO
EXAMPLE = ROOT / "dashboards" / "prometheus.yml"
TENANTS = {"acme": 3.0, "globex": 1.0, "initech": 1.0}

pytestmark = pytest.mark.skipif(prometheus_binary() is None,
                                reason="prometheus not installed (.ci/install-prometheus.sh)")

APP = '''
import random, time
import fairq

app = fairq.App()

@app.task(name="work", lease=30)
def work(job: fairq.Job) -> None:
    time.sleep(random.uniform(0.005, 0.03))

@app.task(name="flaky", lease=30, max_attempts=3)
def flaky(job: fairq.Job) -> None:
    if job.attempt == 1:
        raise RuntimeError("first attempts fail")
'''


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            err = proc.stderr.read().decode() if proc.stderr and proc.poll() is not None else ""
            raise AssertionError(f"{url} never answered 200: {err[-3000:]}")
        time.sleep(0.1)


def spawn(args: list[str], env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    out = log.open("wb")
    return subprocess.Popen([sys.executable, "-m", "fairq", *args], env=env, cwd=cwd,
                            stdout=out, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def flowing(dsn: str, tmp_path: Path) -> Iterator[list[str]]:
    """Worker, exporter and a producer running, jobs of 3 tenants flowing; yields targets."""
    (tmp_path / "e2eapp.py").write_text(textwrap.dedent(APP))
    env = {**os.environ, "FAIRQ_DATABASE_URL": dsn,
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    app = App(dsn, pool_size=2)
    for tenant, weight in TENANTS.items():
        app.tenants.set(tenant, weight=weight, max_running=4,
                        rate=1000.0 if tenant == "acme" else None)  # the rate panels' series
    producer = PrometheusObserver(max_tenants=50)  # producers can export their enqueues too
    producer_server = producer.serve(0, "127.0.0.1")
    stop_producing = threading.Event()

    def produce() -> None:
        i = 0
        while not stop_producing.is_set():
            for tenant in TENANTS:
                n = 6 if tenant == "acme" else 3
                task = "flaky" if i % 5 == 0 else "work"
                app.enqueue_many(task, [(tenant, {"i": i})] * n)
                producer.on_enqueue("default", tenant, n)
            i += 1
            stop_producing.wait(0.2)

    producer_thread = threading.Thread(target=produce, daemon=True)
    producer_thread.start()
    worker_port, exporter_port = free_port(), free_port()
    worker = spawn(["worker", "e2eapp:app", "--concurrency", "4", "--metrics-port",
                    str(worker_port), "--metrics-host", "127.0.0.1", "--poll-interval", "0.5"],
                   env, tmp_path, tmp_path / "worker.log")
    exporter = spawn(["exporter", "--port", str(exporter_port), "--host", "127.0.0.1",
                      "--interval", "0", "--window", "60", "--probe-interval", "2"],
                     env, tmp_path, tmp_path / "exporter.log")
    try:
        wait_http(f"http://127.0.0.1:{worker_port}/healthz", worker)
        wait_http(f"http://127.0.0.1:{exporter_port}/healthz", exporter)
        yield [f"127.0.0.1:{worker_port}", f"127.0.0.1:{exporter_port}",
               f"127.0.0.1:{producer_server.port}"]
    finally:
        stop_producing.set()
        producer_thread.join(timeout=10)
        stop(worker)
        stop(exporter)
        producer_server.close()
        app.close()
        for name in ("worker.log", "exporter.log"):
            log = (tmp_path / name).read_text(errors="replace")
            print(f"--- {name} (tail)\n{log[-2000:]}")


def example_config(workers: list[str], exporter: str) -> dict[str, Any]:
    """dashboards/prometheus.yml, the example users start from, with this test's targets and a
    1 s scrape interval."""
    cfg: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    cfg["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
    cfg["rule_files"] = [str((EXAMPLE.parent / f).resolve()) for f in cfg["rule_files"]]
    jobs = {job["job_name"]: job for job in cfg["scrape_configs"]}
    assert set(jobs) == {"fairq-workers", "fairq-exporter"}
    jobs["fairq-workers"]["static_configs"] = [{"targets": workers}]
    jobs["fairq-exporter"]["static_configs"] = [{"targets": [exporter]}]
    return cfg


def test_every_dashboard_and_alert_expression_returns_data(flowing: list[str], tmp_path: Path,
                                                           dsn: str) -> None:
    worker, exporter, producer = flowing
    prom = start_prometheus([], tmp_path / "prom",
                            config=example_config([worker, producer], exporter))
    try:
        prom.wait_scraped(samples=5, timeout=90)
        # Worker series (rates) and exporter series must both be in.
        prom.wait_for('rate(fairq_jobs_claimed_total{tenant="acme"}[1m]) > 0', timeout=60)
        prom.wait_for("fairq_tenant_queued_jobs", timeout=30)
        exprs: list[tuple[str, str]] = []
        for name in sorted(UIDS):
            exprs += [(name, e) for e in dashboard_exprs(DASHBOARDS / name, SUBSTITUTIONS)]
        exprs += [(f"alert {a}", without_thresholds(e)) for a, e in alert_exprs().items()]
        assert len(exprs) > 30
        empty: list[str] = []
        for where, expr in exprs:
            try:
                prom.wait_for(expr, timeout=20)
            except PromQLError as exc:
                pytest.fail(f"{where}: does not parse/evaluate: {exc}")
            except TimeoutError:
                empty.append(f"{where}: {expr}")
        assert not empty, "expressions without data:\n" + "\n".join(empty)
        # The alert rules were loaded and evaluated by Prometheus itself without errors.
        rules = prom.rules()
        assert {r["name"] for r in rules} >= set(alert_exprs())
        assert all(r.get("health") in ("ok", "unknown") for r in rules), rules
        check_new_tenant_shows(prom, dsn)
    finally:
        prom.stop()


def check_new_tenant_shows(prom: Any, dsn: str) -> None:
    """A tenant that appears mid-run: its series' first sample is 0 and the burst follows, so
    the per-tenant p95 of the waiting panel has it within two scrapes of its claims."""
    with App(dsn, pool_size=1) as app:
        app.tenants.set("hooli", weight=1.0, max_running=4)
        ids = app.enqueue_many("work", [("hooli", {})] * 8)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(
                (info := app.job(i)) is None or info.status == "queued" for i in ids):
            time.sleep(0.05)
    claimed_at = time.monotonic()
    p95 = ('histogram_quantile(0.95, sum by (tenant, le) '
           '(rate(fairq_job_wait_seconds_bucket{tenant="hooli"}[1m])))')
    while True:  # a number, not NaN (which is what rate() of a burst in a first sample gives)
        result = prom.query(p95)
        if result and result[0]["value"][1] not in ("NaN", "+Inf"):
            break
        assert time.monotonic() - claimed_at < 30, f"no p95 for the new tenant: {result}"
        time.sleep(0.2)
    took = time.monotonic() - claimed_at
    assert took <= 5.0, f"the new tenant's p95 took {took:.1f}s (scrapes every 1 s)"
    first = prom.api("/api/v1/query_range", query='fairq_job_wait_seconds_count{tenant="hooli"}',
                     start=str(time.time() - 120), end=str(time.time()), step="1s")
    values = [float(v) for series in first["result"] for _, v in series["values"]]
    assert values and values[0] == 0 and max(values) > 0, values
