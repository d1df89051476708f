"""Small seeded workloads drained by a real worker process, for every policy: nothing left behind.

Each test enqueues a workload, runs ``fairq worker MODULE:APP --concurrency 4 --until-empty``
as a subprocess on the test database, and then reads the jobs table: the worker must exit 0 with
every job `done` (none queued or running left) and none run twice (attempts == 1). No timings
are asserted.

Workloads: (a) a whale of 300 jobs, then 500 one-job tenants; (b) two one-job tenants and a
whale of 200 capped at 2; (c) 50 tenants with jobs delayed 1-2 s and a whale of 200; (d) a seeded
random shape (30 tenants of 1-60 jobs, some caps of 1-3, weights 0.5-10, some priorities and costs).

In (c) a "clock" job holds one of the worker's slots until every delayed job is due, so the
worker cannot rightly call the queue empty before then (--until-empty stops once nothing is
runnable *now*): whatever is left at its exit was due and should have run.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fairq.models import NewJob, TenantConfig
from fairq.store import Store
from tests.support.db import SCHEMA, create_database, drop_database, dsn_for_db
from tests.support.fairtools import keep_pristine_copy, restore_pristine
from tests.support.paths import REPO

FAIRQ = Path(sys.executable).with_name("fairq")
POLICIES = ["fifo", "round_robin", "weighted", "drr", "time"]
CONCURRENCY = 4
WORKER_TIMEOUT = 60.0
DEFAULTS = (1.0, 10)
SEED = 2025

TASKS = """\
import time

import fairq

app = fairq.App()


@app.task(name="m.noop")
def noop(job):
    pass


@app.task(name="m.clock")
def clock(job):
    time.sleep(max(0.0, job.payload["until"] - time.time()))
"""


def job(tenant: str, **kw: Any) -> NewJob:
    return NewJob("m.noop", tenant, "{}", **kw)


def whale_and_crowd(store: Store, rng: random.Random) -> None:
    """(a) a whale of 300 jobs, then 500 tenants with one job each (the whale's jobs first).

    Sized past the margin of the engine before the rewrite (d62ef8e): there an empty claim
    retired up to ~140 tenants that had run their only job, and the worker claimed twice before
    calling the queue empty, so 300 one-job tenants happened to drain and 400 failed only now and
    then; 500 left the whale's 299 jobs queued every time."""
    store.enqueue([job("whale")] * 300)
    store.enqueue([job(f"t{i:03d}") for i in range(500)])


def capped_whale(store: Store, rng: random.Random) -> None:
    """(b) a whale of 200 capped at 2 and two tenants with one job each."""
    store.set_tenants([TenantConfig("whale", 1.0, 2)])
    store.enqueue([job("whale")] * 200 + [job("small1"), job("small2")])


def delayed_crowd(store: Store, rng: random.Random) -> None:
    """(c) 50 tenants with 1-3 jobs delayed 1-2 s, a whale of 200, and the clock job."""
    delayed = [job(f"d{i:02d}", delay=round(rng.uniform(1.0, 2.0), 3))
               for i in range(50) for _ in range(rng.randint(1, 3))]
    store.enqueue([job("whale")] * 200 + delayed)
    # Enqueued last so that nothing else is delayed past it (the database clock is the client's).
    until = time.time() + 2.5
    store.enqueue([NewJob("m.clock", "clock", f'{{"until": {until}}}', priority=10)])


def random_shape(store: Store, rng: random.Random) -> None:
    """(d) 30 tenants with 1-60 jobs, some capped 1-3, weights 0.5-10, priorities and costs."""
    configs: list[TenantConfig] = []
    jobs: list[NewJob] = []
    for i in range(30):
        tenant = f"r{i:02d}"
        n = rng.choice([1, 1, 2, 3, 5, 8, 13, 21, 40, 60])
        cap = rng.randint(1, 3) if rng.random() < 0.3 else DEFAULTS[1]
        weight = rng.choice([0.5, 1.0, 2.0, 3.0, 5.0, 10.0])
        configs.append(TenantConfig(tenant, weight, cap))
        for _ in range(n):
            jobs.append(job(tenant, priority=rng.choice([0, 0, 0, 1, 5]),
                            cost=rng.choice([1.0, 1.0, 2.0, 5.0])))
    rng.shuffle(jobs)
    store.set_tenants(configs)
    store.enqueue(jobs)


WORKLOADS = {
    "whale_then_500_one_job_tenants": whale_and_crowd,
    "two_singles_and_whale_capped_2": capped_whale,
    "50_delayed_tenants_and_whale": delayed_crowd,
    "random_shape_seed_2025": random_shape,
}


def run_worker(dsn: str, folder: Path, policy: str) -> subprocess.CompletedProcess[str]:
    (folder / "matrix_tasks.py").write_text(TASKS)
    env = {**os.environ, "FAIRQ_DATABASE_URL": dsn, "FAIRQ_SCHEMA": SCHEMA,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    cmd = [str(FAIRQ), "worker", "matrix_tasks:app", "--dsn", dsn, "--schema", SCHEMA,
           "--concurrency", str(CONCURRENCY), "--until-empty", "--policy", policy,
           "--poll-interval", "0.2"]
    try:
        return subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True,
                              timeout=WORKER_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        pytest.fail(f"the worker did not exit within {WORKER_TIMEOUT:.0f} s; "
                    f"left: {leftovers(dsn)}\nstderr tail:\n{tail(err)}")


def tail(text: str, n: int = 6) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def leftovers(dsn: str) -> str:
    """The jobs not done, by tenant and status: 'whale: 287 queued (ids 14..599)'."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT tenant, status, count(*), min(id), max(id) FROM fairq.jobs "
            "WHERE status <> 'done' GROUP BY 1, 2 ORDER BY 3 DESC, 1").fetchall()
    parts = [f"{t}: {n} {s} (ids {lo}..{hi})" for t, s, n, lo, hi in rows[:12]]
    if len(rows) > 12:
        parts.append(f"... and {len(rows) - 12} more (tenant, status) groups")
    return "; ".join(parts) or "nothing"


@pytest.fixture(scope="module")
def matrix_db(admin_dsn: str, template_db: str) -> Iterator[str]:
    """One migrated database for the module, with a copy of its tables as migrated: a CREATE and
    DROP DATABASE per test cost more than the drains themselves on a small box."""
    name = create_database(admin_dsn, "fairq_matrix", template=template_db)
    dsn = dsn_for_db(admin_dsn, name)
    try:
        keep_pristine_copy(dsn, SCHEMA, "matrix_pristine")
        yield dsn
    finally:
        drop_database(admin_dsn, name)


@pytest.fixture
def fresh_dsn(matrix_db: str) -> str:
    """The module's database with every fairq table back to its content as migrated."""
    restore_pristine(matrix_db, SCHEMA, "matrix_pristine")
    return matrix_db


# Every policy on the shape that stalled the old engine; the default policy on every shape, and
# drr and time on the random one (ten worker runs).
CASES = ([(p, "whale_then_500_one_job_tenants") for p in POLICIES]
         + [("weighted", w) for w in WORKLOADS if w != "whale_then_500_one_job_tenants"]
         + [("drr", "random_shape_seed_2025"), ("time", "random_shape_seed_2025")])


@pytest.mark.parametrize(("policy", "workload"), CASES)
def test_worker_drains_every_job_exactly_once(
        fresh_dsn: str, tmp_path: Path, policy: str, workload: str) -> None:
    dsn = fresh_dsn
    store = Store(dsn, SCHEMA, max_size=2)
    try:
        store.set_tenants([], defaults=DEFAULTS)
        WORKLOADS[workload](store, random.Random(SEED))
    finally:
        store.close()
    with psycopg.connect(dsn) as conn:
        (total,) = conn.execute("SELECT count(*) FROM fairq.jobs").fetchone() or (0,)
    assert total >= 200, f"the workload enqueued only {total} jobs"

    proc = run_worker(dsn, tmp_path, policy)

    left = leftovers(dsn)
    assert proc.returncode == 0, (
        f"{policy}/{workload}: the worker exited {proc.returncode}; left: {left}\n"
        f"stderr tail:\n{tail(proc.stderr)}")
    with psycopg.connect(dsn) as conn:
        statuses = dict(conn.execute(
            "SELECT status, count(*) FROM fairq.jobs GROUP BY 1").fetchall())
        twice = conn.execute(
            "SELECT id, tenant, attempts FROM fairq.jobs WHERE attempts <> 1 ORDER BY id LIMIT 10"
        ).fetchall()
        counted = conn.execute(
            "SELECT tenant, fairq.tenant_running(ts) FROM fairq.tenant_schedule ts "
            "WHERE fairq.tenant_running(ts) <> 0").fetchall()
    assert statuses == {"done": total}, (
        f"{policy}/{workload}: the worker exited 0 but not every job is done "
        f"({statuses}); left: {left}\nworker's last lines:\n{tail(proc.stderr)}")
    assert twice == [], f"{policy}/{workload}: jobs run other than once (id, tenant, attempts): {twice}"
    assert counted == [], f"{policy}/{workload}: tenants still counted as running: {counted}"
