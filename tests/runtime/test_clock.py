"""Leases and run_at use the database clock only: a worker process whose wall clock is an
hour fast or slow behaves exactly like one with the right clock. The skew is real for the whole
process (``time.time`` and ``datetime.now`` are moved before fairq is imported, see
tests/support/fault_worker.py); the assertions are the same for every skew."""

from __future__ import annotations

from pathlib import Path

import pytest

import fairq
from tests.support.fault_tools import check_final_state, executions, spawn_worker, sql, stop_worker, wait_for


@pytest.mark.parametrize("skew", [0, 3600, -3600])
def test_worker_with_a_wrong_clock_behaves_the_same(dsn: str, tmp_path: Path, skew: int) -> None:
    with fairq.App(dsn) as app:
        # A job held longer than its 3 s lease by a correct-clock worker: a fast-clock reaper
        # that trusted its own clock would steal it.
        held = app.enqueue("hold", tenant="h", payload={"s": 7}, lease=3)
        steady = spawn_worker(dsn, tmp_path, "--concurrency", "1", "--poll", "0.3")
        wait_for(lambda: sql(dsn, "SELECT status FROM fairq.jobs WHERE id = %s",
                             (held,))[0][0] == "running", what="the held job to start")
        delayed = app.enqueue("work", tenant="d", delay=4)
        quick = app.enqueue_many("work", [(f"q{i % 3}", {"ms": 1}) for i in range(40)])
        skewed = spawn_worker(dsn, tmp_path, "--concurrency", "2", "--poll", "0.3",
                              "--reap-interval", "0.2", "--clock-skew", str(skew))
        leases: list[float] = []
        try:
            def sample() -> bool:
                rows = sql(dsn, "SELECT extract(epoch FROM locked_until - now()), lease_seconds "
                                "FROM fairq.jobs WHERE status = 'running'")
                leases.extend(float(r[0]) - r[1] for r in rows)
                return bool(sql(dsn, "SELECT bool_and(status = 'done') FROM fairq.jobs")[0][0])
            wait_for(sample, timeout=90, what="all jobs done", interval=0.05)
        finally:
            out_skewed, err_skewed = stop_worker(skewed)
            stop_worker(steady)
    ids = [held, delayed, *quick]
    check_final_state(dsn, ids)
    # every lease was set and extended on the database clock (locked_until - now() within
    # (-lease, lease]): never an hour off
    assert leases and all(-300 < s <= 0.5 for s in leases), (min(leases), max(leases))
    # nobody reaped a live lease or ran anything twice
    assert sql(dsn, "SELECT max(attempts) FROM fairq.jobs")[0][0] == 1
    started, _ = executions(tmp_path)
    assert all(started[i] == 1 for i in ids), started
    # the delayed job ran on time by the database clock: not early (fast clock), and not an hour
    # late (slow clock): it did finish in this test
    row = sql(dsn, "SELECT started_at >= run_at, run_at - created_at FROM fairq.jobs WHERE id = %s",
              (delayed,))[0]
    assert row[0], "the delayed job started before its run_at"
    assert 3.5 <= row[1].total_seconds() <= 4.5
    assert "STATS" in out_skewed, err_skewed
