"""Smoke run of the peer harness: each peer installs, enqueues, drains and runs a tiny
noisy neighbour against a fresh random database, leaving no worker process behind."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fairq.bench.peers import _harness as h

JOBS = 200


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it has exited all the same.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[-1][:1] != "Z"


@pytest.fixture
def dsn(admin_dsn: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv(h.ADMIN_DSN_ENV, admin_dsn)  # the suite's server, embedded or not
    try:
        with psycopg.connect(h.admin_dsn(), connect_timeout=5):
            pass
    except psycopg.OperationalError as exc:
        pytest.skip(f"no PostgreSQL at the admin DSN: {exc}")
    with h.scratch_database("peers_smoke") as name:
        yield name


def _check(
    bench: Any, dsn: str, drain_kwargs: dict[str, int], noisy_kwargs: dict[str, Any]
) -> None:
    installed = bench.install(dsn)
    assert installed["version"]
    bench.reset(dsn)
    enq = bench.enqueue(dsn, JOBS, tenants=3)
    assert enq["jobs"] == JOBS and enq["jobs_per_s"] > 0
    drained = bench.drain(dsn, JOBS, **drain_kwargs)
    assert drained["done"] == JOBS
    assert drained["jobs_per_s"] > 0
    assert not [p for p in drained["worker_pids"] if _alive(p)]
    noisy = bench.noisy_neighbour(
        dsn, big_jobs=40, small_tenants=3, small_jobs=2, job_seconds=0.0, **noisy_kwargs
    )
    assert noisy["jobs"] == noisy["started"] == 46
    assert sorted(noisy["tenant_waits_s"], key=int) == ["1", "2", "3", "4"]
    assert 6 <= noisy["small_tenants_last_claim_index"] <= 46
    assert all(w >= 0 for waits in noisy["tenant_waits_s"].values() for w in waits)


def test_pgqueuer_smoke(dsn: str) -> None:
    pytest.importorskip("pgqueuer", reason="PgQueuer not installed (bench extra)")
    pytest.importorskip("asyncpg", reason="asyncpg not installed (bench extra)")
    from fairq.bench.peers import pgqueuer_bench

    _check(pgqueuer_bench, dsn, {"processes": 2, "batch_size": 50}, {"per_tenant_limit": 0})


def test_procrastinate_smoke(dsn: str) -> None:
    pytest.importorskip("procrastinate", reason="Procrastinate not installed (bench extra)")
    from fairq.bench.peers import procrastinate_bench

    _check(procrastinate_bench, dsn, {"processes": 1, "concurrency": 4}, {"lock_per_tenant": True})
