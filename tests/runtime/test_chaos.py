"""Chaos soak: several worker processes over many capped tenants while one of them is
killed with SIGKILL at random points of the drain and restarted. Sampled throughout, no tenant
ever has more running jobs than its cap; at the end every job is done, attempts <= max_attempts,
no running slot is leaked, and no attempt ran twice.

CI runs a short version; ``FAIRQ_SLOW=1`` runs the long one (more jobs, more kills).
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import psycopg
import pytest

import fairq
from tests.support.fault_tools import (
    check_final_state,
    executions,
    migrated_db,
    private_cluster,
    spawn_worker,
    sql,
    stop_worker,
    worker_stderr,
)

SLOW = os.environ.get("FAIRQ_SLOW") == "1"
JOBS = int(os.environ.get("FAIRQ_CHAOS_JOBS", 10000 if SLOW else 3000))
TENANTS = 60 if SLOW else 30
WORKERS = 3
KILLS = 12 if SLOW else 5

CAP_CHECK = """
SELECT ts.tenant, ts.max_running, fairq.tenant_running(ts) AS running, count(j.id) AS actual
FROM fairq.tenant_schedule ts
LEFT JOIN fairq.jobs j ON j.queue = ts.queue AND j.tenant = ts.tenant AND j.status = 'running'
GROUP BY ts.queue, ts.tenant, ts.max_running, 3
HAVING count(j.id) > ts.max_running OR fairq.tenant_running(ts) > ts.max_running
    OR fairq.tenant_running(ts) <> count(j.id)
"""


@pytest.mark.timeout(2400 if SLOW else 600)
def test_chaos_kill_9_soak(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("FAIRQ_CHAOS_SEED", "7")))
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    with private_cluster(tmp_path, max_connections="100") as holder:
        dsn = migrated_db(holder[0])
        with fairq.App(dsn) as app:
            for i in range(TENANTS):
                app.tenants.set(f"t{i}", weight=1.0 + i % 3, max_running=1 + i % 3)
            app.task(lambda job: None, name="work", lease=5, max_attempts=20)  # its defaults
            ids = app.enqueue_many("work", [(f"t{rng.randrange(TENANTS)}",
                                             {"ms": rng.randint(5, 60)}) for _ in range(JOBS)])
        violations: list[object] = []
        samples = 0
        stop = threading.Event()

        def sampler() -> None:
            nonlocal samples
            with psycopg.connect(dsn, autocommit=True) as c:
                while not stop.is_set():
                    # one statement, one snapshot: the counters and the rows agree exactly
                    rows = c.execute(CAP_CHECK).fetchall()
                    if rows:
                        violations.append(rows)
                    samples += 1
                    stop.wait(0.05)

        th = threading.Thread(target=sampler, daemon=True)
        th.start()
        args = ("--concurrency", "6", "--poll", "0.5", "--reap-interval", "0.3")
        workers = [spawn_worker(dsn, log_dir, *args) for _ in range(WORKERS)]
        kills = 0
        t0 = time.monotonic()
        outs: list[tuple[str, str]] = []
        # Kills are paced by progress, not by the clock: a fast box must not drain the queue
        # before the soak has killed anyone, a slow one must not be killed over and over.
        milestones = sorted(rng.uniform(0.05, 0.6) for _ in range(KILLS))
        progress = psycopg.connect(dsn, autocommit=True)  # one session polls, not one per poll
        try:
            deadline = time.monotonic() + (1800 if SLOW else 400)
            while left := progress.execute(
                    "SELECT count(*) FROM fairq.jobs WHERE status <> 'done'").fetchall()[0][0]:
                assert time.monotonic() < deadline, "the soak did not finish"
                assert all(w.poll() is None for w in workers), "a worker died on its own"
                if not milestones or (JOBS - left) < milestones[0] * JOBS:
                    time.sleep(0.05)
                    continue
                milestones.pop(0)
                victim = rng.randrange(WORKERS)
                workers[victim].kill()  # SIGKILL: no finish, no hand-back, no goodbye
                workers[victim].wait(30)
                outs.append(("", worker_stderr(workers[victim])))
                kills += 1
                workers[victim] = spawn_worker(dsn, log_dir, *args)
        finally:
            progress.close()
            stop.set()
            th.join(10)
            outs += [stop_worker(w) for w in workers]
            for w in workers:
                if w.poll() is None:
                    w.kill()
        assert violations == [], violations[:3]
        assert samples >= 20
        assert kills >= 3, f"only {kills} kills before the queue drained"
        check_final_state(dsn, ids)
        started, finished = executions(log_dir)
        assert set(finished) == set(ids)
        attempts = dict(sql(dsn, "SELECT id, attempts FROM fairq.jobs"))
        assert all(started[i] <= attempts[i] for i in ids)  # no attempt ran twice
        reruns = sum(1 for i in ids if attempts[i] > 1)
        print(f"chaos: {JOBS} jobs, {TENANTS} tenants, {kills} kills, {samples} cap samples, "
              f"{reruns} jobs re-run after a kill, {time.monotonic() - t0:.0f}s")
        assert not any("Traceback" in err for _, err in outs if err), \
            [err[-1500:] for _, err in outs if "Traceback" in err][:1]


