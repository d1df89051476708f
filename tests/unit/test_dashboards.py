"""Grafana dashboards and alert rules: static checks, then every PromQL expression evaluated by a
real Prometheus scraping synthetic fairq metrics."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from tests.support.observability import ALERTS, DASHBOARDS, SUBSTITUTIONS, UIDS, alert_exprs
from tests.support.paths import REPO
from tests.support.prom import (
    Prometheus,
    dashboard_exprs,
    prometheus_binary,
    start_prometheus,
    without_thresholds,
)

ROOT = REPO

# The metrics of docs/metrics.md.
COUNTERS = {
    "fairq_jobs_enqueued_total",
    "fairq_jobs_claimed_total",
    "fairq_jobs_finished_total",
    "fairq_leases_expired_total",
    "fairq_jobs_inserted_total",
    "fairq_tenant_throttled_seconds_total",
}
HISTOGRAMS = {
    "fairq_job_wait_seconds",
    "fairq_job_run_seconds",
    "fairq_claim_seconds",
    "fairq_claim_planning_seconds",
    "fairq_claim_execution_seconds",
}
GAUGES = {
    "fairq_tenant_queued_jobs",
    "fairq_tenant_running_jobs",
    "fairq_tenant_max_running",
    "fairq_tenant_weight",
    "fairq_oldest_runnable_job_age_seconds",
    "fairq_fairness_jain_index",
    "fairq_fairness_max_share_error",
    "fairq_jobs_dead_tuples",
    "fairq_metrics_tenants_folded",
    "fairq_claim_replan_ratio",
    "fairq_jobs_last_autovacuum_timestamp_seconds",
    "fairq_tenant_delayed_jobs",
    "fairq_tenant_rate_limit",
    "fairq_tenant_rate_tokens",
    "fairq_tenant_throttled",
    "fairq_group_claim_share",
    "fairq_group_weight_share",
    "fairq_tenants_waiting",
}
METRICS = COUNTERS | HISTOGRAMS | GAUGES
SERIES_NAMES = (
    COUNTERS | GAUGES | {h + s for h in HISTOGRAMS for s in ("_bucket", "_sum", "_count")}
)


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DASHBOARDS / name).read_text())
    return data


def all_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels", []))


# --- static -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(UIDS))
def test_dashboard_structure(name: str) -> None:
    dash = load(name)
    assert dash["schemaVersion"] >= 39
    assert dash["uid"] == UIDS[name]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    ds = variables["datasource"]
    assert (ds["type"], ds["query"]) == ("datasource", "prometheus")
    ids = [p["id"] for p in all_panels(dash["panels"])]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for panel in all_panels(dash["panels"]):
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24, panel["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & mine, f"{panel['title']} overlaps another panel"
        cells |= mine
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert target["expr"].strip(), panel["title"]
    for var in variables.values():
        if var["type"] == "query":
            assert var["datasource"]["uid"] == "${datasource}", var["name"]


def test_tenant_dashboard_variables() -> None:
    variables = {v["name"]: v for v in load("fairq-tenant.json")["templating"]["list"]}
    assert variables["tenant"]["query"]["query"].startswith("label_values(fairq_tenant_queued_jobs")
    assert variables["queue"]["query"]["query"] == "label_values(fairq_tenant_queued_jobs, queue)"
    assert not variables["tenant"]["multi"]


def test_only_contract_metrics_and_all_of_them() -> None:
    used: set[str] = set()
    exprs = [e for name in UIDS for e in dashboard_exprs(DASHBOARDS / name, SUBSTITUTIONS)]
    for expr in [*exprs, *alert_exprs().values()]:
        names = set(re.findall(r"\bfairq_\w+", expr))
        assert names <= SERIES_NAMES, f"unknown metric(s) {names - SERIES_NAMES} in {expr}"
        used |= {re.sub(r"_(bucket|sum|count)$", "", n) if n not in METRICS else n for n in names}
    assert used == METRICS, f"metrics on no panel or alert: {METRICS - used}"


def test_dashboard_exprs_cover_panels_and_variables() -> None:
    exprs = dashboard_exprs(DASHBOARDS / "fairq-tenant.json", SUBSTITUTIONS)
    assert 'fairq_tenant_queued_jobs{queue=~"default"}' in exprs  # from the tenant variable
    assert not any("$" in e for e in exprs)
    with pytest.raises(KeyError):
        dashboard_exprs(DASHBOARDS / "fairq-tenant.json", {"datasource": "x"})


def test_without_thresholds() -> None:
    assert without_thresholds('a{b!="c"} > 0.5 and on (q) c >= bool 2') == (
        'a{b!="c"} > bool 0.5 and on (q) c >= bool 2'
    )


def test_generated_dashboards_are_current() -> None:
    res = subprocess.run(
        [sys.executable, str(DASHBOARDS / "generate.py"), "--check"], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr


def test_provisioning() -> None:
    yaml = pytest.importorskip("yaml", reason="PyYAML not installed")
    providers = yaml.safe_load((DASHBOARDS / "provisioning/dashboards.yml").read_text())
    assert providers["apiVersion"] == 1 and providers["providers"][0]["type"] == "file"
    sources = yaml.safe_load((DASHBOARDS / "provisioning/datasource.yml").read_text())
    assert sources["datasources"][0]["type"] == "prometheus"
    rules = yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"]
    assert {r["alert"]: r["expr"].strip() for r in rules} == alert_exprs()


# --- live: a real Prometheus scraping synthetic samples ---------------------------------------

TENANTS = {"acme": (3.0, 20), "globex": (1.0, 10), "initech": (1.0, 5)}  # weight, max_running


class SyntheticFairq:
    """Every contract metric, for 3 tenants, in an incident state that makes every alert true:
    acme hogs claims, initech starves, most claims are empty, dead tuples pile up.
    Each scrape advances the counters and histograms so that rates are non-zero."""

    def __init__(self) -> None:
        self.registry = reg = CollectorRegistry()
        self.lock = threading.Lock()
        qt, qtp, qto = (
            ["queue", "tenant"],
            ["queue", "tenant", "policy"],
            ["queue", "tenant", "outcome"],
        )
        self.enqueued = Counter("fairq_jobs_enqueued_total", "", qt, registry=reg)
        self.claimed = Counter("fairq_jobs_claimed_total", "", qtp, registry=reg)
        self.finished = Counter("fairq_jobs_finished_total", "", qto, registry=reg)
        self.expired = Counter("fairq_leases_expired_total", "", ["queue"], registry=reg)
        self.inserted = Counter("fairq_jobs_inserted_total", "", [], registry=reg)
        self.throttled = Counter("fairq_tenant_throttled_seconds_total", "", qt, registry=reg)
        self.wait = Histogram("fairq_job_wait_seconds", "", qt, registry=reg)
        self.run = Histogram("fairq_job_run_seconds", "", [*qt, "task"], registry=reg)
        self.claim = Histogram(
            "fairq_claim_seconds", "", ["queue", "policy", "result"], registry=reg
        )
        self.planning = Histogram("fairq_claim_planning_seconds", "", ["policy"], registry=reg)
        self.execution = Histogram("fairq_claim_execution_seconds", "", ["policy"], registry=reg)
        g = {
            name: Gauge(name, "", labels, registry=reg)
            for name, labels in [
                ("fairq_tenant_queued_jobs", qt),
                ("fairq_tenant_delayed_jobs", qt),
                ("fairq_tenant_running_jobs", qt),
                ("fairq_tenant_max_running", ["tenant"]),
                ("fairq_tenant_weight", ["tenant"]),
                ("fairq_oldest_runnable_job_age_seconds", qt),
                ("fairq_fairness_jain_index", ["queue"]),
                ("fairq_fairness_max_share_error", ["queue"]),
                ("fairq_claim_replan_ratio", ["policy"]),
                ("fairq_jobs_dead_tuples", []),
                ("fairq_metrics_tenants_folded", []),
                ("fairq_jobs_last_autovacuum_timestamp_seconds", []),
                ("fairq_tenant_rate_limit", qt),
                ("fairq_tenant_rate_tokens", qt),
                ("fairq_tenant_throttled", qt),
                ("fairq_group_claim_share", ["queue", "group"]),
                ("fairq_group_weight_share", ["queue", "group"]),
                ("fairq_tenants_waiting", ["queue", "reason"]),
            ]
        }
        g["fairq_tenant_rate_limit"].labels("default", "acme").set(5.0)
        g["fairq_tenant_rate_tokens"].labels("default", "acme").set(0.2)
        g["fairq_tenant_throttled"].labels("default", "acme").set(1)
        for group, (claims, weight) in {"enterprise": (0.5, 0.75), "pro": (0.5, 0.25)}.items():
            g["fairq_group_claim_share"].labels("default", group).set(claims)
            g["fairq_group_weight_share"].labels("default", group).set(weight)
        for i, (tenant, (weight, cap)) in enumerate(TENANTS.items()):
            g["fairq_tenant_weight"].labels(tenant).set(weight)
            g["fairq_tenant_max_running"].labels(tenant).set(cap)
            g["fairq_tenant_queued_jobs"].labels("default", tenant).set(100 * (i + 1))
            g["fairq_tenant_delayed_jobs"].labels("default", tenant).set(10 * i)
            g["fairq_tenant_running_jobs"].labels("default", tenant).set(cap // 2)
            g["fairq_oldest_runnable_job_age_seconds"].labels("default", tenant).set(
                900 if tenant == "initech" else 20
            )
        g["fairq_fairness_jain_index"].labels("default").set(0.62)
        g["fairq_fairness_max_share_error"].labels("default").set(0.3)
        g["fairq_claim_replan_ratio"].labels("weighted").set(0.01)
        for reason, n in (("running", 2), ("at_cap", 1), ("waiting_turn", 3)):
            g["fairq_tenants_waiting"].labels("default", reason).set(n)
        g["fairq_metrics_tenants_folded"].set(0)
        g["fairq_jobs_last_autovacuum_timestamp_seconds"].set(time.time() - 3600)
        self.dead_tuples = g["fairq_jobs_dead_tuples"]
        self.dead_tuples.set(2_000_000)

    def tick(self) -> None:
        for i, tenant in enumerate(TENANTS):
            n = 3 - i  # acme gets the most claims
            self.enqueued.labels("default", tenant).inc(n + 1)
            self.claimed.labels("default", tenant, "weighted").inc(n)
            for outcome in ("done", "retry", "failed", "lease_lost"):
                self.finished.labels("default", tenant, outcome).inc(n if outcome == "done" else 1)
            for k in range(n):
                self.wait.labels("default", tenant).observe(0.05 * (k + 1) * (i + 1))
                self.run.labels("default", tenant, "reports.send").observe(0.3 * (k + 1))
        for result, count in (("claimed", 2), ("empty", 6), ("error", 1)):
            for k in range(count):
                self.claim.labels("default", "weighted", result).observe(0.002 * (k + 1))
        self.planning.labels("weighted").observe(0.0004)
        self.execution.labels("weighted").observe(0.0015)
        self.expired.labels("default").inc()
        self.inserted.inc(7)
        self.throttled.labels("default", "acme").inc(0.8)
        self.dead_tuples.inc(5000)

    def serve(self) -> ThreadingHTTPServer:
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with exporter.lock:
                    exporter.tick()
                    body = generate_latest(exporter.registry)
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server


@pytest.fixture(scope="module")
def prom(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Prometheus:
    if prometheus_binary() is None:
        pytest.skip("prometheus not installed (run .ci/install-prometheus.sh)")
    server = SyntheticFairq().serve()
    request.addfinalizer(server.server_close)
    request.addfinalizer(server.shutdown)
    started = time.monotonic()
    p = start_prometheus(
        [f"127.0.0.1:{server.server_address[1]}"],
        tmp_path_factory.mktemp("prometheus"),
        rule_files=[ALERTS],
    )
    request.addfinalizer(p.stop)
    p.wait_scraped(samples=3)  # rate() and deriv() need two; three leaves a margin
    p.wait_for("count(ALERTS) >= 5", timeout=60)  # every rule has been evaluated (pending)
    print(f"prometheus ready with data in {time.monotonic() - started:.1f}s")
    return p


def check(prom: Prometheus, expr: str) -> str | None:
    try:
        return None if prom.query(expr) else f"empty: {expr}"
    except Exception as e:
        return f"error: {e}"


@pytest.mark.parametrize("name", sorted(UIDS))
def test_dashboard_exprs_return_data(prom: Prometheus, name: str) -> None:
    exprs = dashboard_exprs(DASHBOARDS / name, SUBSTITUTIONS)
    assert len(exprs) > 10
    failures = [f for e in exprs if (f := check(prom, e))]
    assert not failures, "\n".join(failures)


def test_alert_exprs_return_data(prom: Prometheus) -> None:
    exprs = alert_exprs()
    loaded = {r["name"]: r for r in prom.rules() if r["type"] == "alerting"}
    assert (
        set(loaded)
        == set(exprs)
        == {"TenantStarving", "FairnessIndexLow", "ClaimsMostlyEmpty", "DeadTuplesGrowing",
            "GroupShareErrorHigh"}
    )
    assert all(r["health"] == "ok" for r in loaded.values()), loaded
    failures = []
    for expr in exprs.values():
        # as written (true on this incident data), and with every comparison made `bool`, which
        # keeps the series a threshold would drop: returns data on healthy samples too
        relaxed = without_thresholds(expr)
        assert relaxed != expr and " bool " in relaxed
        failures += [f for e in (expr, relaxed) if (f := check(prom, e))]
    assert not failures, "\n".join(failures)


def test_the_tenant_enqueue_rate_falls_back_to_the_database() -> None:
    """Producers that serve no metrics leave fairq_jobs_enqueued_total empty: the panel then shows
    the rate the exporter's database gauges and the claims give."""
    tenant = json.loads((ROOT / "dashboards" / "fairq-tenant.json").read_text())
    exprs = [t["expr"] for p in tenant["panels"] for t in p.get("targets", [])
             if "fairq_jobs_enqueued_total" in t.get("expr", "")]
    assert exprs, "no enqueue panel"
    for expr in exprs:
        own, _, fallback = expr.partition("\nor\n")
        assert "fairq_jobs_enqueued_total" in own
        assert "deriv(fairq_tenant_queued_jobs" in fallback
        assert "fairq_jobs_claimed_total" in fallback
