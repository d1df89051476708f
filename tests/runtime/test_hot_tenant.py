"""One busy tenant: its finishes do not queue behind its claims on its schedule row.

One worker process of 8 slots drains a single tenant while a producer keeps adding jobs to it.
Every claim writes the tenant's row; a finish that finds the row held leaves its slot in
slot_returns (slots.sql) rather than wait. A sampler reads ``pg_stat_activity`` every 10 ms:
the active sessions of the database, and those waiting on a lock, by statement. Before the
slot returns, a finish waited for a claim in about a quarter of the active samples of this
flood (benchmarks/hot_tenant.py, docs/scaling.md). Also checked: every job done once and the
running count exact at the end.

Four worker processes on one capped tenant (decision 015): the claims that waited for its row
count slots ahead for their worker, which its later claims start without the row. A sampler
reads the tenant's running jobs and its running count as the database counts it: neither ever
passes the cap, while slots ahead were held; every job ran exactly once.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest

import fairq
from tests.support.fault_tools import (
    check_final_state,
    executions,
    spawn_worker,
    sql,
    stop_worker,
    wait_for,
)

SECONDS = 6.0



def produce(dsn: str, ids: list[int], stop: threading.Event, errors: list[BaseException], *,
            ms: int, chunk: int) -> None:
    """Until ``stop``: ``chunk`` more jobs of ``ms`` ms for the hot tenant every 20 ms, their ids
    added to ``ids``; an error goes to ``errors`` (the test reports it)."""
    try:
        with fairq.App(dsn) as app:
            app.task(lambda job: None, name="work", lease=30, max_attempts=3)
            while not stop.is_set():
                ids.extend(app.enqueue_many("work", [("hot", {"ms": ms})] * chunk))
                stop.wait(0.02)
    except BaseException as e:  # reported by the caller
        errors.append(e)

@pytest.mark.timeout(240)
def test_a_one_tenant_flood_barely_waits_on_locks(dsn: str, tmp_path: Path) -> None:
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    with fairq.App(dsn) as app:
        app.tenants.set("hot", weight=1.0, max_running=1000)
        app.task(lambda job: None, name="work", lease=30, max_attempts=3)
        ids = app.enqueue_many("work", [("hot", {"ms": 0})] * 3000)
    stop = threading.Event()
    errors: list[BaseException] = []
    waits: Counter[str] = Counter()
    active = [0]

    def producer() -> None:
        produce(dsn, ids, stop, errors, ms=0, chunk=100)

    def sampler() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                while not stop.is_set():
                    for wtype, query in c.execute(
                            "SELECT wait_event_type, query FROM pg_stat_activity "
                            "WHERE datname = current_database() AND state = 'active' "
                            "AND pid <> pg_backend_pid()").fetchall():
                        active[0] += 1
                        if wtype == "Lock":
                            m = re.search(r"-- fairq (\w+)", query or "")
                            waits[m.group(1) if m else (query or "")[:30]] += 1
                    stop.wait(0.01)
        except BaseException as e:  # reported below
            errors.append(e)

    worker = spawn_worker(dsn, log_dir, "--concurrency", "8", "--poll", "0.2")
    threads = [threading.Thread(target=producer), threading.Thread(target=sampler)]
    try:
        for t in threads:
            t.start()
        time.sleep(SECONDS)
        stop.set()
        for t in threads:
            t.join(30)
        assert not errors, errors
        wait_for(lambda: sql(dsn, "SELECT count(*) FROM fairq.jobs WHERE status <> 'done'")
                 [0][0] == 0, timeout=120, what="every job done")
    finally:
        stop.set()
        stop_worker(worker)
    locked = sum(waits.values())
    finishes = sum(n for what, n in waits.items() if what.startswith("finish"))
    assert active[0] >= 100, f"only {active[0]} active samples: the flood did not run"
    # Finishes never wait for the row; what is left is rare (a claim's DELETE of a slot a
    # finish is inserting cannot wait; a lease extension may meet a finish on a job row).
    assert finishes <= 0.02 * active[0], (finishes, active[0], dict(waits))
    assert locked <= 0.05 * active[0], (locked, active[0], dict(waits))
    check_final_state(dsn, ids)
    started, _ = executions(log_dir)
    assert [i for i, n in started.items() if n > 1] == [], "a job ran twice"


CAP = 40
FLOOD = 3.0


@pytest.mark.timeout(240)
def test_four_processes_on_one_capped_tenant_never_pass_its_cap(dsn: str, tmp_path: Path) -> None:
    """4 processes x 12 slots claiming 2 jobs at a time (each holds up to 14: 56 > CAP, so the
    cap binds) while a producer adds 20 ms jobs. Slots ahead are 8 batches (16) a worker, given
    while the tenant has room for twice as many, and counted as running when given: the running
    jobs (status) and tenant_running stay within CAP in every sample."""
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    with fairq.App(dsn) as app:
        app.tenants.set("hot", weight=1.0, max_running=CAP)
        app.task(lambda job: None, name="work", lease=30, max_attempts=3)
        ids = app.enqueue_many("work", [("hot", {"ms": 20})] * 400)
    stop, done = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    most = {"jobs": 0, "counted": 0, "ahead": 0}
    samples = [0]

    def producer() -> None:
        produce(dsn, ids, stop, errors, ms=20, chunk=50)

    def sampler() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                while not done.is_set():
                    jobs, counted, ahead = c.execute(
                        "SELECT (SELECT count(*) FROM fairq.jobs j WHERE j.tenant = 'hot' "
                        "AND j.status = 'running'), fairq.tenant_running(ts), (SELECT "
                        "coalesce(sum(b.slots), 0) FROM fairq.claim_budgets b) "
                        "FROM fairq.tenant_schedule ts WHERE ts.tenant = 'hot'").fetchone() or (0, 0, 0)
                    most["jobs"] = max(most["jobs"], int(jobs))
                    most["counted"] = max(most["counted"], int(counted))
                    most["ahead"] = max(most["ahead"], int(ahead))
                    samples[0] += 1
                    done.wait(0.002)
        except BaseException as e:  # reported below
            errors.append(e)

    workers = [spawn_worker(dsn, log_dir, "--concurrency", "12", "--batch", "2", "--poll", "0.2")
               for _ in range(4)]
    threads = [threading.Thread(target=producer), threading.Thread(target=sampler)]
    try:
        for t in threads:
            t.start()
        time.sleep(FLOOD)
        stop.set()  # the producer stops; the sampler watches the backlog drain
        threads[0].join(30)
        wait_for(lambda: sql(dsn, "SELECT count(*) FROM fairq.jobs WHERE status <> 'done'")
                 [0][0] == 0, timeout=120, what="every job done")
        done.set()
        threads[1].join(30)
        assert not errors, errors
    finally:
        stop.set()
        done.set()
        for w in workers:
            stop_worker(w)
    assert samples[0] >= 100, f"only {samples[0]} samples"
    assert most["ahead"] > 0, f"no slot was ever counted ahead: {most}"
    assert most["jobs"] <= CAP and most["counted"] <= CAP, most  # reached (40 here), never passed
    check_final_state(dsn, ids)
    started, _ = executions(log_dir)
    assert [i for i, n in started.items() if n > 1] == [], "a job ran twice"
    assert set(started) == set(ids)
