"""docs/metrics.md documents every metric a worker and the exporter actually export, and every
link in the dashboards, the alert rules and the guides resolves to a file in the repository."""

from __future__ import annotations

import json
import re

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fairq.metrics import PrometheusObserver
from fairq.metrics.exporter import build_registry
from fairq.models import ClaimedJob
from tests.support.paths import REPO

ROOT = REPO
DOC = ROOT / "docs" / "metrics.md"
STANDARD = ("process_", "python_")


def exposed(registry: CollectorRegistry) -> set[str]:
    """Metric names as Prometheus stores them (counters with their _total)."""
    names = set()
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        if fam.name.startswith(STANDARD):
            continue
        names.add(fam.name + "_total" if fam.type == "counter" else fam.name)
    return names


def documented() -> set[str]:
    return set(re.findall(r"`(fairq_[a-z_]+)`", DOC.read_text()))


def worker_metrics() -> set[str]:
    from datetime import UTC, datetime

    obs = PrometheusObserver(CollectorRegistry(), max_tenants=5)
    now = datetime.now(UTC)
    job = ClaimedJob(id=1, queue="q", tenant="a", task="t", payload={}, attempts=1,
                     max_attempts=3, lease_seconds=30, run_at=now, started_at=now,
                     locked_until=now, priority=0, cost=1.0)
    obs.on_enqueue("q", "a", 1)
    obs.on_claim("q", "weighted", "claimed", 0.01, [job])
    obs.on_finish(job, "done", 0.2)
    obs.on_reap("q", 1)
    obs.on_loop(True)
    return exposed(obs.registry)


def test_every_worker_metric_is_documented() -> None:
    names = worker_metrics()
    assert "fairq_job_wait_seconds" in names and "fairq_jobs_claimed_total" in names
    assert names - documented() == set()


def test_every_exporter_metric_is_documented(dsn: str) -> None:
    registry = build_registry(dsn, "fairq", interval=0, probe_interval=1)
    names = exposed(registry)
    assert {"fairq_tenant_queued_jobs", "fairq_jobs_inserted_total",
            "fairq_claim_planning_seconds", "fairq_exporter_up"} <= names
    assert names - documented() == set()


def test_the_doc_names_no_metric_that_does_not_exist(dsn: str) -> None:
    names = worker_metrics() | exposed(build_registry(dsn, "fairq", interval=0))
    assert documented() - names == set()


# -- links ----------------------------------------------------------------------------------------
def repo_paths(text: str) -> set[str]:
    """Paths of repository files a text points at: docs/x.md, dashboards/x.yml, deploy/..."""
    return set(re.findall(r"\b((?:docs|dashboards|deploy|tests)/[\w./-]+\.(?:md|yml|yaml|json|py|"
                          r"service))\b", text))


def test_dashboards_and_alerts_point_to_files_that_exist() -> None:
    texts = {p: p.read_text() for p in (ROOT / "dashboards").glob("*") if p.is_file()}
    found = {path for text in texts.values() for path in repo_paths(text)}
    assert "docs/metrics.md" in found  # the alert rules point at it
    missing = sorted(p for p in found if not (ROOT / p).exists())
    assert not missing, missing
    for name in ("fairq-overview.json", "fairq-tenant.json"):
        dash = json.loads((ROOT / "dashboards" / name).read_text())
        for link in dash.get("links", []):  # dashboard links by tag must find a dashboard
            if link.get("type") == "dashboards":
                tagged = [d for d in ("fairq-overview.json", "fairq-tenant.json")
                          if set(link["tags"]) <= set(json.loads(
                              (ROOT / "dashboards" / d).read_text()).get("tags", []))]
                assert tagged, link
            else:
                assert link.get("url", "").startswith(("http", "/d/")), link


def test_links_in_the_guides_resolve() -> None:
    for doc in (ROOT / "docs").glob("*.md"):
        text = doc.read_text()
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            assert (doc.parent / target).exists(), f"{doc.name}: broken link {target}"
        for path in repo_paths(text):
            assert (ROOT / path).exists(), f"{doc.name}: {path} does not exist"
