"""``fairq bench`` end to end on a tiny scenario: every figure for every policy, nothing left over."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from fairq.bench import metrics, options, suite
from fairq.cli import main

FIGURES = (
    "throughput_jobs_s", "wait_p50_s", "wait_p95_s", "wait_p99_s", "tenant_p95_median_s",
    "tenant_p95_max_s", "claim_p95_ms", "claim_p99_ms", "plan_ms", "exec_ms", "lock_wait_share",
    "lock_waiting_mean", "locks_not_granted_max", "empty_claim_ratio", "jain_index",
    "max_share_error",
)


def _databases(dsn: str) -> set[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {r[0] for r in conn.execute("SELECT datname FROM pg_database").fetchall()}


# One pytest process runs both bench runs: each checks no fairq_bench_* database is left.
@pytest.mark.xdist_group("bench")
def test_tiny_bench_reports_every_figure_for_every_policy(admin_dsn: str, tmp_path: Path) -> None:
    before = {d for d in _databases(admin_dsn) if d.startswith("fairq_bench_")}
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "fairq", "bench", "--tiny", "--no-progress", "--dsn", admin_dsn,
         "--json", str(out), "--plots", str(tmp_path / "plots")],
        capture_output=True, text=True, timeout=240, cwd=tmp_path)
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


@pytest.mark.parametrize(("argv", "needed"), [
    (["--tiny", "--no-progress"], []),
    (["--tiny"], []),  # no tqdm: no progress bar, the run goes on
    (["--tiny", "--no-progress", "--plots", "out"], ["matplotlib"]),
    (["--quick", "--no-progress"], list(options.PEER_PACKAGES)),
    (["--quick", "--no-progress", "--no-peers"], []),
])
def test_a_run_needs_only_the_optional_packages_its_options_use(
    argv: list[str], needed: list[str]
) -> None:
    p = argparse.ArgumentParser()
    options.add_arguments(p)
    assert options.needed_packages(p.parse_args(argv)) == needed


def test_a_missing_optional_package_is_one_line_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in options.PEER_PACKAGES:  # installed or not here, find_spec says not installed
        monkeypatch.setitem(sys.modules, name, None)
    # No server at this DSN: the check comes before any connection.
    code = main(["--dsn", "postgresql://nobody@127.0.0.1:1/none", "bench", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.splitlines() == [
        "fairq bench: pgqueuer, asyncpg, procrastinate not installed: pip install 'fairq[bench]'"
    ], err
