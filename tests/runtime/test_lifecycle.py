"""Job lifecycle against the real PostgreSQL: exactly-once claims, backoff, the reaper
, maintenance leadership, and worker processes killed or stopped by signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import fairq
from fairq.observe import NullObserver
from fairq.policies import get_policy
from fairq.runtime.maintenance import DueWaker, MaintenanceSchedule, Pruner, Reaper
from fairq.store import Store
from tests.support.paths import REPO, SUPPORT

SCHEMA = "fairq"
WORKER_PROC = SUPPORT / "worker_proc.py"
FIFO = get_policy("fifo")


@pytest.fixture
def app(dsn: str) -> Iterator[fairq.App]:
    a = fairq.App(dsn, schema=SCHEMA)  # registers no task: any name may be enqueued
    yield a
    a.close()


def sql(dsn: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as c:
        cur = c.execute(query, params)
        return cur.fetchall() if cur.description else []


# -- the naive claim double-claims; fairq's claims are exactly once --------------------------
NAIVE_CLAIM = """
UPDATE fairq.jobs SET status = 'running', attempts = attempts + 1
WHERE id = (SELECT id FROM fairq.jobs WHERE status = 'queued' ORDER BY id LIMIT 1)
RETURNING id
"""


def test_naive_claim_double_claims(app: fairq.App, dsn: str) -> None:
    """Seed 000: 8 connections, 10,000 claims with UPDATE ... WHERE id = (SELECT ... LIMIT 1)."""
    app.enqueue_many("t", [("a", {}) for _ in range(10_000)])
    claims: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def worker() -> None:
        mine: list[int] = []
        with psycopg.connect(dsn, autocommit=True) as c:
            barrier.wait()
            for _ in range(10_000 // 8):
                row = c.execute(NAIVE_CLAIM).fetchone()
                if row:
                    mine.append(row[0])
        with lock:
            claims.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    per_job = Counter(claims)
    assert len(claims) > len(per_job), "expected the naive statement to claim a job twice"
    assert max(per_job.values()) >= 2
    # the database agrees: some rows were "claimed" (attempts bumped) more than once
    assert sql(dsn, "SELECT max(attempts) FROM fairq.jobs")[0][0] >= 2


@pytest.mark.parametrize("policy", ["fifo", "weighted"])
def test_fairq_claim_exactly_once(app: fairq.App, dsn: str, policy: str) -> None:
    app.tenants.set("a", max_running=10_000)  # caps are not the subject here
    for t in ("b", "c"):
        app.tenants.set(t, max_running=10_000)
    app.enqueue_many("t", [("abc"[i % 3], {}) for i in range(10_000)])
    pol = get_policy(policy)
    claims: list[tuple[int, int]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        store = Store(dsn, SCHEMA, min_size=1, max_size=1)  # its own connection
        mine: list[tuple[int, int]] = []
        try:
            barrier.wait()
            empty = 0
            while empty < 3:
                jobs = store.claim(pol, queue="default", batch=10, worker=f"w{n}")
                if not jobs:
                    empty += 1
                    continue
                empty = 0
                mine.extend((j.id, j.attempts) for j in jobs)
                done = store.finish_done([(j.id, j.attempts) for j in jobs])
                assert len(done) == len(jobs)
        except BaseException as e:
            errors.append(e)
        finally:
            store.close()
            with lock:
                claims.extend(mine)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    per_job = Counter(i for i, _ in claims)
    assert len(per_job) == 10_000
    assert set(per_job.values()) == {1}
    assert {a for _, a in claims} == {1}
    assert sql(dsn, "SELECT status, count(*), max(attempts) FROM fairq.jobs GROUP BY 1") == [
        ("done", 10_000, 1)]
    assert sql(dsn, "SELECT sum(fairq.tenant_running(ts)) FROM fairq.tenant_schedule ts") == [(0,)]


# -- backoff schedule and max_attempts ------------------------------------------------------
def _make_due(dsn: str, job_id: int) -> float:
    """Seconds from now to the job's run_at; then make it due (time passes)."""
    (delay,) = sql(dsn, "SELECT extract(epoch FROM run_at - now())::float8 FROM fairq.jobs "
                        "WHERE id = %s", (job_id,))[0]
    sql(dsn, "UPDATE fairq.jobs SET run_at = now() - interval '1 ms' WHERE id = %s", (job_id,))
    return float(delay)


def test_backoff_schedule_and_max_attempts(app: fairq.App, store: Store, dsn: str) -> None:
    job_id = app.enqueue("t", tenant="a", max_attempts=5)
    delays: list[float] = []
    for attempt in range(1, 6):
        (job,) = store.claim(FIFO, queue="default", batch=1, worker="w")
        assert (job.id, job.attempts) == (job_id, attempt)
        (fin,) = store.finish_failed([(job.id, job.attempts, f"boom {attempt}", None)])
        if attempt < 5:
            assert fin.status == "queued"
            delays.append(_make_due(dsn, job_id))
        else:
            assert fin.status == "failed"
    assert [round(d) for d in delays] == [20, 40, 80, 160]
    info = app.job(job_id)
    assert info is not None
    assert (info.status, info.attempts, info.last_error) == ("failed", 5, "boom 5")
    assert info.finished_at is not None
    assert store.claim(FIFO, queue="default", batch=1, worker="w") == []


def test_backoff_capped_at_one_hour(app: fairq.App, store: Store, dsn: str) -> None:
    job_id = app.enqueue("t", tenant="a", max_attempts=50)
    sql(dsn, "UPDATE fairq.jobs SET attempts = 12 WHERE id = %s", (job_id,))  # 20*2^12 > 3600
    (job,) = store.claim(FIFO, queue="default", batch=1, worker="w")
    store.finish_failed([(job.id, job.attempts, "x", None)])
    assert round(_make_due(dsn, job_id)) == 3600


def test_explicit_retry_delay(app: fairq.App, store: Store, dsn: str) -> None:
    job_id = app.enqueue("t", tenant="a")
    (job,) = store.claim(FIFO, queue="default", batch=1, worker="w")
    store.finish_failed([(job.id, job.attempts, "x", 0.0)])
    assert store.claim(FIFO, queue="default", batch=1, worker="w")[0].id == job_id


# -- the reaper honours max_attempts --------------------------------------------------------
class ReapLog(NullObserver):
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def on_reap(self, queue: str, expired: int, failed: int = 0) -> None:
        self.calls.append((queue, expired))


def _expire(dsn: str, job_id: int) -> None:
    sql(dsn, "UPDATE fairq.jobs SET locked_until = now() - interval '1 s' WHERE id = %s",
        (job_id,))


def test_reaper_requeues_then_fails_at_max_attempts(app: fairq.App, store: Store,
                                                     dsn: str) -> None:
    job_id = app.enqueue("t", tenant="a", max_attempts=2, queue="q")
    obs = ReapLog()
    reaper = Reaper(store, observer=obs)
    (job,) = store.claim(FIFO, queue="q", batch=1, worker="w1")
    assert reaper.run_once() == 0  # the lease has not expired
    _expire(dsn, job_id)
    assert reaper.run_once() == 1
    info = app.job(job_id)
    assert info is not None and (info.status, info.attempts) == ("queued", 1)
    assert info.last_error == "lease expired during attempt 1 of 2 (worker w1)"
    assert store.finish_done([(job.id, job.attempts)]) == []  # the slow worker changes nothing
    (job2,) = store.claim(FIFO, queue="q", batch=1, worker="w2")
    assert job2.attempts == 2
    _expire(dsn, job_id)
    assert reaper.run_once() == 1
    info = app.job(job_id)
    assert info is not None and (info.status, info.attempts) == ("failed", 2)
    assert info.last_error == "lease expired during attempt 2 of 2 (worker w2)"
    assert obs.calls == [("q", 1), ("q", 1)]
    assert sql(dsn, "SELECT fairq.tenant_running(ts) FROM fairq.tenant_schedule ts") == [(0,)]
    assert store.claim(FIFO, queue="q", batch=1, worker="w3") == []


# -- maintenance services and leadership --------------------------------------------------------
class CountingService:
    def __init__(self, key: str, interval: float) -> None:
        self.key, self.interval, self.runs = key, interval, 0

    def run_once(self) -> int:
        self.runs += 1
        return 0


def test_maintenance_runs_once_per_interval_across_workers(store: Store) -> None:
    now = [1000.0]
    a, b = CountingService("k", 3600.0), CountingService("k", 3600.0)
    sched_a = MaintenanceSchedule(store, [a], clock=lambda: now[0])
    sched_b = MaintenanceSchedule(store, [b], clock=lambda: now[0])
    sched_a.run_due()
    sched_b.run_due()  # due locally too, but the database says someone did it this interval
    assert (a.runs, b.runs) == (1, 0)
    sched_a.run_due()  # not due locally: does not even ask
    assert a.runs == 1
    assert sched_a.next_due() == pytest.approx(1000.0 + 3600.0)


def test_maintenance_due_again_after_interval(store: Store) -> None:
    svc = CountingService("k2", 0.2)
    sched = MaintenanceSchedule(store, [svc])
    sched.run_due()
    time.sleep(0.25)
    sched.run_due()
    assert svc.runs == 2


def test_due_waker_and_pruner(app: fairq.App, store: Store, dsn: str) -> None:
    job_id = app.enqueue("t", tenant="a", delay=3600)
    pol = get_policy("weighted")
    assert store.claim(pol, queue="default", batch=1, worker="w") == []  # tenant goes idle
    sql(dsn, "UPDATE fairq.jobs SET run_at = now() - interval '1 s' WHERE id = %s", (job_id,))
    sql(dsn, "UPDATE fairq.tenant_schedule SET wake_at = now() - interval '1 s' "
             "WHERE NOT active")
    DueWaker(store).run_once()
    (job,) = store.claim(pol, queue="default", batch=1, worker="w")
    assert job.id == job_id
    store.finish_done([(job.id, job.attempts)])
    assert Pruner(store, max_age=3600).run_once() == 0  # too young
    assert Pruner(store, max_age=0).run_once() == 1
    assert app.job(job_id) is None


# -- worker processes ---------------------------------------------------------------------------
def spawn(dsn: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.Popen([sys.executable, str(WORKER_PROC), dsn, *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO))
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line.startswith("READY"), (line, p.stderr.read() if p.poll() is not None else "")
    return p


def outcome(p: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """The worker's stdout and stderr once it exits; if it has not within ``timeout``, its
    threads' stacks (worker_proc dumps them on SIGUSR1) go into the failure message.

    Read through the pipes' file objects, not ``communicate()`` (which reads the descriptors):
    spawn's ``readline`` may have buffered the lines after READY already (a drain that ends at
    once prints READY and STATS together)."""
    got: dict[str, str] = {}
    readers = [threading.Thread(target=lambda n=n, f=f: got.__setitem__(n, f.read()), daemon=True)
               for n, f in (("out", p.stdout), ("err", p.stderr))]
    for r in readers:
        r.start()
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
        p.kill()
        p.wait()
        for r in readers:
            r.join(10)
        out, err = got.get("out", ""), got.get("err", "")
        pytest.fail(f"the worker did not exit within {timeout}s\nstdout:\n{out}\nstderr:\n{err}")
    for r in readers:
        r.join(10)
    return got.get("out", ""), got.get("err", "")


def wait_for_line(p: subprocess.Popen[str], text: str, timeout: float = 30.0) -> bool:
    """Read the worker's stderr until a line contains ``text`` (False after ``timeout``)."""
    found = threading.Event()

    def read() -> None:
        assert p.stderr is not None
        for line in p.stderr:
            if text in line:
                found.set()
                return

    threading.Thread(target=read, daemon=True).start()
    return found.wait(timeout)


def wait_for(pred: Any, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_kill_9_mid_job_another_worker_finishes(app: fairq.App, dsn: str,
                                                tmp_path: Path) -> None:
    mark = tmp_path / "job"
    job_id = app.enqueue("sleepy", tenant="a", lease=2,
                         payload={"seconds": 60, "mark": str(mark), "sleep_attempts": [1]})
    victim = spawn(dsn, "--concurrency", "2")
    try:
        wait_for(lambda: Path(f"{mark}.started.1").exists(), what="the job to start")
        victim.kill()  # SIGKILL: no finish, no hand-back
        victim.wait(30)
    finally:
        if victim.poll() is None:
            victim.kill()
    info = app.job(job_id)
    assert info is not None and info.status == "running" and info.attempts == 1
    wait_for(lambda: sql(dsn, "SELECT locked_until < now() FROM fairq.jobs WHERE id = %s",
                         (job_id,))[0][0], what="the lease to expire")
    rescuer = spawn(dsn, "--until-empty")  # reaps at start-up, claims, runs, exits
    out, err = outcome(rescuer, 60)
    assert rescuer.returncode == 0, err
    info = app.job(job_id)
    assert info is not None and (info.status, info.attempts) == ("done", 2), info
    assert Path(f"{mark}.done.2").exists() and not Path(f"{mark}.done.1").exists()
    assert "done=1" in out


def test_sigterm_lets_inflight_finish(app: fairq.App, dsn: str, tmp_path: Path) -> None:
    mark = tmp_path / "job"
    job_id = app.enqueue("sleepy", tenant="a", payload={"seconds": 1.5, "mark": str(mark)})
    later = app.enqueue("sleepy", tenant="a", delay=3600, payload={})
    p = spawn(dsn, "--concurrency", "2")
    try:
        wait_for(lambda: Path(f"{mark}.started.1").exists(), what="the job to start")
        p.send_signal(signal.SIGTERM)
        # the job takes 1.5 s; the grace period (30 s) must not be slept through after it
        out, err = outcome(p, 20)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    assert "done=1" in out and "abandoned=0" in out
    info = app.job(job_id)
    assert info is not None and (info.status, info.attempts) == ("done", 1)
    later_info = app.job(later)
    assert later_info is not None and (later_info.status, later_info.attempts) == ("queued", 0)
    # the worker closed its sessions (backends exit asynchronously: wait for it)
    wait_for(lambda: sql(dsn, "SELECT count(*) FROM pg_stat_activity WHERE application_name "
                              "LIKE 'fairq-worker%%' AND datname = current_database()") == [(0,)],
             timeout=30, what="the worker's sessions to close")


def test_second_signal_exits_at_once(app: fairq.App, dsn: str, tmp_path: Path) -> None:
    mark = tmp_path / "job"
    job_id = app.enqueue("sleepy", tenant="a", payload={"seconds": 120, "mark": str(mark)})
    p = spawn(dsn)
    try:
        wait_for(lambda: Path(f"{mark}.started.1").exists(), what="the job to start")
        p.send_signal(signal.SIGTERM)
        # The second signal only means "exit now" once the first one is being handled: wait for
        # the worker's log line saying so (not a fixed pause, which a loaded machine outlasts).
        assert wait_for_line(p, "stopping (in-flight jobs get"), "the first signal was not logged"
        assert p.poll() is None  # the first signal waits for the in-flight job
        p.send_signal(signal.SIGTERM)
        outcome(p, 30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 128 + signal.SIGTERM
    info = app.job(job_id)
    assert info is not None and info.status == "running"  # its lease will expire; the reaper returns it
