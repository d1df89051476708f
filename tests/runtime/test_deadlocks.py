"""A flood with no deadlock: 3 worker processes x 4 slots over capped tenants while a live
producer enqueues (single jobs, bulk chunks, some with keys). The database's deadlock counter
(``pg_stat_database.deadlocks``, the test's own database) must not grow, and every job must be
done exactly once (each execution is logged by the worker that ran it).

CI runs a short flood; ``FAIRQ_SLOW=1`` (marker ``slow``) runs a longer one.
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest

import fairq
from tests.support.fault_tools import (
    executions,
    spawn_worker,
    sql,
    stop_worker,
    wait_for,
)

TENANTS = 7
CAPPED = 6  # tenants t0..t5 have max_running 1-3; t6 has the default cap


def deadlocks(dsn: str) -> int:
    return int(sql(dsn, "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")[0][0])


def stats_flushed(dsn: str) -> None:
    # Statistics reach pg_stat_database when a backend reports them (at idle, at most once a
    # second) and are read from a per-transaction snapshot: wait for the reports to land.
    time.sleep(1.5)
    sql(dsn, "SELECT pg_stat_clear_snapshot()")


def flood(dsn: str, tmp_path: Path, seconds: float) -> None:
    rng = random.Random(47)
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    with fairq.App(dsn) as app:
        for i in range(CAPPED):
            app.tenants.set(f"t{i}", weight=1.0 + i % 3, max_running=1 + i % 3)
        app.task(lambda job: None, name="work", lease=5, max_attempts=20)  # its defaults
    stats_flushed(dsn)
    before = deadlocks(dsn)
    workers = [spawn_worker(dsn, log_dir, "--concurrency", "4", "--poll", "0.5")
               for _ in range(3)]
    ids: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def producer() -> None:
        try:
            with fairq.App(dsn) as app:
                app.task(lambda job: None, name="work", lease=5, max_attempts=20)
                n = 0
                while not stop.is_set():
                    n += 1
                    shape = n % 4
                    if shape == 0:  # a bulk chunk over every tenant
                        ids.extend(app.enqueue_many("work", [
                            (f"t{rng.randrange(TENANTS)}", {"ms": rng.randint(0, 3)})
                            for _ in range(rng.randint(20, 80))]))
                    elif shape == 1:  # a chunk with keys, every key new
                        ids.extend(app.enqueue_many("work", [
                            (f"t{rng.randrange(TENANTS)}", {"ms": 1}, f"k{n}-{k}")
                            for k in range(rng.randint(2, 10))]))
                    else:  # single jobs, every other one keyed
                        for k in range(5):
                            ids.append(app.enqueue(
                                "work", tenant=f"t{rng.randrange(TENANTS)}",
                                payload={"ms": rng.randint(0, 3)},
                                key=f"s{n}-{k}" if k % 2 else None))
                    stop.wait(0.005)
        except BaseException as e:  # reported by the test
            errors.append(e)

    th = threading.Thread(target=producer, daemon=True)
    th.start()
    try:
        time.sleep(seconds)
        stop.set()
        th.join(30)
        assert not errors, errors
        assert len(ids) > 1000, f"the producer enqueued only {len(ids)} jobs"
        wait_for(lambda: sql(dsn, "SELECT count(*) FROM fairq.jobs WHERE status <> 'done'")
                 [0][0] == 0, timeout=120, what="every job done")
    finally:
        stop.set()
        outs = [stop_worker(p) for p in workers]
    stats_flushed(dsn)
    grown = deadlocks(dsn) - before
    assert grown == 0, (f"{grown} deadlocks in {seconds:.0f} s of flood; worker logs:\n"
                        + "\n".join(err[-2000:] for _, err in outs))
    started, finished = executions(log_dir)
    assert len(set(ids)) == len(ids)
    assert set(finished) == set(ids)
    twice = {i: n for i, n in started.items() if n > 1}
    assert twice == {}, f"jobs run more than once: {list(twice.items())[:10]}"


@pytest.mark.timeout(240)
def test_flood_has_no_deadlock(dsn: str, tmp_path: Path) -> None:
    flood(dsn, tmp_path, seconds=15.0)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("FAIRQ_SLOW") != "1", reason="long flood: FAIRQ_SLOW=1")
@pytest.mark.timeout(900)
def test_long_flood_has_no_deadlock(dsn: str, tmp_path: Path) -> None:
    flood(dsn, tmp_path, seconds=120.0)
