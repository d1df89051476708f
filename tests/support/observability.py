"""Shared by the metrics, exporter, dashboard and end-to-end tests: reading metrics,
promtool, the dashboards' files, a quick enqueue."""

from __future__ import annotations

import re
import shutil
import subprocess
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fairq.models import NewJob
from fairq.store import Store
from tests.support.paths import REPO

DASHBOARDS = REPO / "dashboards"
ALERTS = DASHBOARDS / "alerts.yml"
UIDS = {"fairq-overview.json": "fairq-overview", "fairq-tenant.json": "fairq-tenant"}
SUBSTITUTIONS = {
    "datasource": "prometheus",
    "queue": "default",
    "tenant": "acme",
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "5m",
}


def alert_exprs() -> dict[str, str]:
    """alertname -> expr, read without a YAML library (the rules file keeps `expr: |` blocks)."""
    exprs, name = {}, ""
    lines = ALERTS.read_text().splitlines()
    for i, line in enumerate(lines):
        if m := re.match(r"\s*- alert: (\w+)", line):
            name = m.group(1)
        elif line.strip() == "expr: |":
            indent = len(line) - len(line.lstrip()) + 2
            block = []
            for nxt in lines[i + 1 :]:
                if nxt.strip() and len(nxt) - len(nxt.lstrip()) < indent:
                    break
                block.append(nxt[indent:])
            exprs[name] = "\n".join(block).strip()
    return exprs


def enqueue(store: Store, tenant: str, n: int, queue: str = "default", delay: float | None = None
            ) -> None:
    store.enqueue([NewJob(task="t", tenant=tenant, payload_json="{}", queue=queue, delay=delay)
                   for _ in range(n)])


def samples(registry: CollectorRegistry) -> dict[str, float]:
    """'name{labels}' -> value of every sample."""
    out = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def promtool_check(text: bytes) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (run .ci/install-prometheus.sh)")
    res = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True)
    assert res.returncode == 0, (res.stdout + res.stderr).decode() + "\n" + text.decode()[:3000]


def fetch(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
