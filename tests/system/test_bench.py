"""``fairq bench`` end to end on a tiny scenario: every figure for every policy, nothing left over."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
from support.paths import REPO

from benchmarks import metrics, suite

FIGURES = (
    "throughput_jobs_s", "wait_p50_s", "wait_p95_s", "wait_p99_s", "tenant_p95_median_s",
    "tenant_p95_max_s", "claim_p95_ms", "claim_p99_ms", "plan_ms", "exec_ms", "lock_wait_share",
    "lock_waiting_mean", "locks_not_granted_max", "empty_claim_ratio", "jain_index",
    "max_share_error",
)


def _databases(dsn: str) -> set[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {r[0] for r in conn.execute("SELECT datname FROM pg_database").fetchall()}


def test_tiny_bench_reports_every_figure_for_every_policy(admin_dsn: str, tmp_path: Path) -> None:
    before = {d for d in _databases(admin_dsn) if d.startswith("fairq_bench_")}
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "fairq", "bench", "--tiny", "--no-progress", "--dsn", admin_dsn,
         "--json", str(out), "--plots", str(tmp_path / "plots")],
        capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    by_policy = {r["policy"]: r for r in doc["results"]}
    assert set(by_policy) == set(suite.POLICIES)
    for policy, r in by_policy.items():
        missing = [k for k in FIGURES if not isinstance(r.get(k), int | float)]
        assert not missing, (policy, missing)
        assert r["completed_jobs"] == r["expected_jobs"] == 75 and not r["timed_out"], policy
        assert r["plan_samples"] >= 1 and r["claims"] >= 1, policy
        assert set(r["group_wait"]) == {"big", "small"}, policy
    # FIFO serves the big tenant's 60 jobs before any small one: the first half of the run is
    # all one tenant, far from the fair allocation; the fair policies are close to it.
    assert by_policy["fifo"]["jain_index"] < 0.5
    for policy in ("rr_article", "round_robin", "weighted", "drr"):
        assert by_policy[policy]["jain_index"] > 0.8, policy
    for policy in suite.POLICIES:
        assert f"| {policy} |" in proc.stdout
    assert (tmp_path / "plots" / "tiny_tenant_wait.png").stat().st_size > 1000
    assert {d for d in _databases(admin_dsn) if d.startswith("fairq_bench_")} == before


def test_ideal_allocation_water_fills_by_weight() -> None:
    alloc = metrics.ideal_allocation(10, {"a": 100, "b": 100, "c": 1}, {"a": 2.0})
    assert alloc["c"] == 1
    assert abs(alloc["a"] - 6.0) < 1e-9 and abs(alloc["b"] - 3.0) < 1e-9


def test_bench_outside_a_checkout_says_so(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-I", "-c",
                           "import sys; sys.path[:0] = [sys.argv[1]];"
                           "import fairq.cli.bench as b; b._suite = lambda: None;"
                           "sys.exit(b.run(None))", str(REPO)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert proc.returncode == 1
    assert "run it from a checkout" in proc.stderr
