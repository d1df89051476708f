"""Leases and run_at use the database clock only: worker processes whose wall clock is an hour
fast or slow behave exactly like one with the right clock. The skew is real for the whole
process (``time.time`` and ``datetime.now`` are moved before fairq is imported, see
tests/support/fault_worker.py); the assertions are the same for every skew.

One run holds the three skews at once, each worker on a queue of its own with its own jobs, so
each skew's leases, delayed job and executions are checked apart; their reapers (which reap
every queue) all face the one job held past its lease.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import fairq
from tests.support.fault_tools import check_final_state, executions, spawn_worker, sql, stop_worker, wait_for

SKEWS = (0, 3600, -3600)


def _queue(skew: int) -> str:
    return f"skew{skew}"


def test_workers_with_a_wrong_clock_behave_the_same(dsn: str, tmp_path: Path) -> None:
    with fairq.App(dsn) as app:
        # A job held longer than its 3 s lease by a correct-clock worker: a fast-clock reaper
        # that trusted its own clock would steal it.
        held = app.enqueue("hold", tenant="h", payload={"s": 7}, lease=3)
        steady = spawn_worker(dsn, tmp_path, "--concurrency", "1", "--poll", "0.3")
        skewed: dict[int, subprocess.Popen[str]] = {}
        try:
            wait_for(lambda: sql(dsn, "SELECT status FROM fairq.jobs WHERE id = %s",
                                 (held,))[0][0] == "running", what="the held job to start")
            for skew in SKEWS:
                skewed[skew] = spawn_worker(
                    dsn, tmp_path, "--concurrency", "2", "--poll", "0.3", "--reap-interval",
                    "0.2", "--clock-skew", str(skew), "--queues", _queue(skew))
            # every skewed reaper is up while the held job still runs past its lease
            assert sql(dsn, "SELECT status FROM fairq.jobs WHERE id = %s",
                       (held,))[0][0] == "running"
            # enqueued once the workers run: a fast clock would claim the delayed job early
            delayed = {s: app.enqueue("work", tenant="d", delay=4, queue=_queue(s)) for s in SKEWS}
            quick = {s: app.enqueue_many("work", [(f"q{i % 3}", {"ms": 1}) for i in range(40)],
                                         queue=_queue(s)) for s in SKEWS}
            # and one each skewed worker holds past its lease: its lease extended on its watch
            own = {s: app.enqueue("hold", tenant="k", payload={"s": 4}, lease=3, queue=_queue(s))
                   for s in SKEWS}
            leases: dict[str, list[float]] = {_queue(s): [] for s in SKEWS}

            def sample() -> bool:
                rows = sql(dsn, "SELECT queue, extract(epoch FROM locked_until - now()), "
                                "lease_seconds FROM fairq.jobs WHERE status = 'running'")
                for queue, left, lease in rows:
                    leases.setdefault(queue, []).append(float(left) - lease)
                return bool(sql(dsn, "SELECT bool_and(status = 'done') FROM fairq.jobs")[0][0])
            wait_for(sample, timeout=90, what="all jobs done", interval=0.05)
        finally:
            outs = {s: stop_worker(p) for s, p in skewed.items()}
            stop_worker(steady)
    ids = [held, *delayed.values(), *own.values(), *(i for q in quick.values() for i in q)]
    check_final_state(dsn, ids)
    # nobody reaped a live lease or ran anything twice
    assert sql(dsn, "SELECT max(attempts) FROM fairq.jobs")[0][0] == 1
    started, _ = executions(tmp_path)
    assert all(started[i] == 1 for i in ids), started
    # every lease was set and extended on the database clock (locked_until - now() within
    # (-lease, lease]): never an hour off; the held job's too
    assert leases["default"], "the held job's lease was never sampled"
    for queue, seen in leases.items():
        assert all(-300 < s <= 0.5 for s in seen), (queue, min(seen), max(seen))
    for skew in SKEWS:
        assert leases[_queue(skew)], f"skew {skew}: no lease sampled"
        # the delayed job ran on time by the database clock: not early (fast clock), and not an
        # hour late (slow clock): it did finish in this test
        row = sql(dsn, "SELECT started_at >= run_at, run_at - created_at FROM fairq.jobs "
                       "WHERE id = %s", (delayed[skew],))[0]
        assert row[0], f"skew {skew}: the delayed job started before its run_at"
        assert 3.5 <= row[1].total_seconds() <= 4.5, (skew, row[1])
        out, err = outs[skew]
        assert "STATS" in out, err
