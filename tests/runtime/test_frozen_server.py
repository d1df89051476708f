"""A frozen server is an outage for the reaper (decision 019): two `fairq worker` processes (4
slots each) drain a backlog of 20-40 ms jobs (lease 10 s) fed by a live producer, on a private
cluster whose postmaster and every child process get SIGSTOP for 20 s, then SIGCONT. No
connection is lost, so no worker sees an outage; but every lease expires during the freeze, and
a claim the server was running when it froze comes back with leases computed from its
transaction's now(), before the freeze: already expired. Without decision 019 the first reaper
to run after SIGCONT returned those jobs (and any lease not renewed yet) to the queue while
their worker ran them, and they ran twice.

The freeze starts while a claim is in flight: the test watches pg_stat_activity for an active
claim and stops that backend first, then the postmaster, then its other children (only the
PIDs of the cluster it started). What it counts is the database's (attempts, the reaper's
last_error) and each handler's own record of its start and end (a file per worker process),
not the workers' logs. The figures are printed.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

import fairq
from fairq.policies import get_policy
from fairq.runtime.maintenance import reap_pinned
from fairq.runtime.outage import Outage
from tests.support.fault_tools import (
    Producer,
    check_final_state,
    migrated_db,
    private_cluster,
    sql,
    wait_for,
)
from tests.support.pgcluster import Cluster

JOBS = 1500
LEASE = 10
FREEZE_SECONDS = 20.0
AFTER_SECONDS = 8.0  # watched after SIGCONT: past the reapers' grace (5 s) and a reap interval

TASKS = f"""\
import os
import time

import fairq

app = fairq.App()
LOG = os.environ["FROZEN_LOG"]


@app.task(name="work", lease={LEASE}, max_attempts=20)
def work(job):
    start = time.time()
    time.sleep(job.payload["ms"] / 1000.0)
    with open(f"{{LOG}}/{{os.getpid()}}.runs", "a") as f:
        f.write(f"{{job.id}} {{job.attempt}} {{start:.6f}} {{time.time():.6f}}\\n")
"""

ACTIVE_CLAIM = ("SELECT pid, query_start FROM pg_stat_activity WHERE state = 'active' "
                "AND query LIKE '-- fairq claim%' LIMIT 1")
STILL_CLAIMING = ("SELECT 1 FROM pg_stat_activity WHERE pid = %s AND query_start = %s "
                  "AND state = 'active' AND query LIKE '-- fairq claim%%'")


def children(pid: int) -> list[int]:
    """The PIDs whose parent is ``pid`` (the postmaster's backends and helpers)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(entry.name))
    return out


def catch_a_claim(watch: psycopg.Connection[Any], timeout: float = 10.0
                  ) -> tuple[int | None, int]:
    """A backend stopped (SIGSTOP) in the middle of a claim, and how many tries it took: one
    seen running a claim is stopped at once, and kept stopped if it is still running that
    claim (its answer not sent: a backend says it is idle before it answers), else let go and
    another one waited for. None if none was caught within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    tries = 0
    while time.monotonic() < deadline:
        row = watch.execute(ACTIVE_CLAIM).fetchone()
        if row is None:
            continue
        pid, query_start = int(row[0]), row[1]
        os.kill(pid, signal.SIGSTOP)
        tries += 1
        still = watch.execute(STILL_CLAIMING, (pid, query_start)).fetchone()
        if still is not None:
            return pid, tries
        os.kill(pid, signal.SIGCONT)
    return None, tries


def freeze(cluster: Cluster, first: int | None) -> list[int]:
    """SIGSTOP the postmaster, then all its children (``first``, a backend already stopped in
    a claim, among them); returns the PIDs stopped, in order."""
    stopped: list[int] = []

    def stop(pid: int) -> None:
        if pid not in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)

    if first is not None:  # a backend of this cluster (its pg_stat_activity said so)
        stop(first)
    stop(cluster.pid)  # no new backend forks from here on
    for pid in children(cluster.pid):
        stop(pid)
    return stopped


def thaw(pids: list[int]) -> None:
    for pid in reversed(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def by_start(run: tuple[int, float, float]) -> float:
    return run[1]


def runs(log_dir: Path) -> dict[int, list[tuple[int, float, float]]]:
    """Per job id: (attempt, start, end) of every execution, over every worker process."""
    out: dict[int, list[tuple[int, float, float]]] = {}
    for f in log_dir.glob("*.runs"):
        for line in f.read_text().splitlines():
            job_id, attempt, start, end = line.split()
            out.setdefault(int(job_id), []).append((int(attempt), float(start), float(end)))
    return out


@pytest.mark.timeout(180)
def test_a_frozen_server_costs_no_live_workers_job(tmp_path: Path) -> None:
    log_dir = tmp_path / "runs"
    log_dir.mkdir()
    (tmp_path / "frozen_tasks.py").write_text(TASKS)
    with private_cluster(tmp_path, synchronous_commit="on") as holder:
        cluster = holder[0]
        dsn = migrated_db(cluster)
        with fairq.App(dsn) as app:
            app.task(lambda job: None, name="work", lease=LEASE, max_attempts=20)
            app.enqueue_many("work", [(f"t{i % 16}", {"ms": 20 + (i * 7) % 21})
                                      for i in range(JOBS)])
        env = {**os.environ, "FROZEN_LOG": str(log_dir)}
        errs = [tmp_path / f"worker-{i}.err" for i in range(2)]
        workers = [subprocess.Popen(
            [sys.executable, "-m", "fairq", "--dsn", dsn, "worker", "frozen_tasks:app",
             "--concurrency", "4", "--poll-interval", "0.5", "--log-level", "info"],
            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=err.open("w"))
            for err in errs]
        producer = Producer(dsn, ms=30)
        producer.app.task(lambda job: None, name="work", lease=LEASE, max_attempts=20)
        stopped: list[int] = []
        n_stopped = 0
        claim_pid: int | None = None
        tries = 0
        try:
            producer.start()
            wait_for(lambda: len(list(log_dir.glob("*.runs"))) == 2
                     and int(sql(dsn, "SELECT count(*) FROM fairq.jobs WHERE status = 'done'")
                             [0][0]) >= 200, timeout=60, what="both workers running jobs")
            with psycopg.connect(cluster.dsn, autocommit=True) as watch:
                claim_pid, tries = catch_a_claim(watch)
                stopped = freeze(cluster, claim_pid)
                frozen_at, n_stopped = time.time(), len(stopped)
                time.sleep(FREEZE_SECONDS)
                thaw(stopped)
                thawed_at = time.time()
                stopped = []
            time.sleep(AFTER_SECONDS)
            produced = producer.stop()
            wait_for(lambda: int(sql(dsn, "SELECT count(*) FROM fairq.jobs "
                                          "WHERE status <> 'done'")[0][0]) == 0,
                     timeout=60, what="every job done")
            assert all(w.poll() is None for w in workers), "a worker died"
        finally:
            thaw(stopped)
            producer.stop()
            for w in workers:
                w.terminate()
            for w in workers:
                try:
                    w.wait(60)
                except subprocess.TimeoutExpired:
                    w.kill()
                    w.wait(10)
        all_ids = [int(r[0]) for r in sql(dsn, "SELECT id FROM fairq.jobs")]
        rerun_db, reaped_db, max_attempts = sql(dsn, """
            SELECT count(*) FILTER (WHERE attempts > 1),
                   count(*) FILTER (WHERE last_error LIKE 'lease expired%%'),
                   coalesce(max(attempts), 0)
            FROM fairq.jobs""")[0]
        claims = {int(r[0]): (float(r[1]), int(r[2])) for r in sql(
            dsn, "SELECT id, extract(epoch FROM started_at), attempts FROM fairq.jobs")}
        check_final_state(dsn, all_ids)
    executed = runs(log_dir)
    twice = sorted(i for i, r in executed.items() if len(r) > 1)
    overlapping = sorted(i for i, r in executed.items()
                         if any(a[2] > b[1] for a, b in itertools.pairwise(sorted(r, key=by_start))))
    stderr = [e.read_text(errors="replace") for e in errs]
    # The claim in flight: claimed before the freeze (the claim's now(); a job claimed again
    # since has a later one, and attempts > 1), its first attempt started after it.
    came_back = [i for i, r in executed.items()
                 if (claims[i][0] < frozen_at or claims[i][1] > 1)
                 and min(s for a, s, _ in r if a == 1) > thawed_at]
    figures = {
        "jobs": len(all_ids), "produced": len(produced),
        "claim_in_flight_at_freeze": claim_pid is not None, "tries_to_catch_it": tries,
        "pids_stopped": n_stopped,
        "freeze_s": round(thawed_at - frozen_at, 1),
        "claimed_before_freeze_run_after": len(came_back),
        "db_jobs_with_attempts_gt_1": rerun_db, "db_jobs_reaped": reaped_db,
        "db_max_attempts": max_attempts,
        "executed_twice": len(twice), "overlapping_runs": len(overlapping),
        "lease_lost_lines": sum(s.count("lease lost") for s in stderr),
        "stall_lines": [s.count("to answer (a stalled server") for s in stderr],
        "reaped_lines": [ln for s in stderr for ln in s.splitlines() if "reaped" in ln][:4],
    }
    print(f"\n{figures}")
    assert claim_pid is not None, "no claim was in flight when the server froze"
    assert came_back, f"the claim caught in flight brought back no job: {figures}"
    assert set(executed) == set(all_ids), "a job never ran"
    assert (rerun_db, reaped_db) == (0, 0), f"a live worker's job was reaped: {figures}"
    assert twice == [], f"jobs ran twice: {twice[:10]} {figures}"


def test_a_stall_restarts_the_grace_and_is_said_once() -> None:
    """Statements slower than a quarter of the grace restart it from their end; while they
    wait, connected_for is 0; several threads' statements ending with one stall log it once;
    with a grace of 0 nothing is a stall."""
    now = [100.0]
    logs: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logs.append(record.getMessage())

    log = logging.getLogger("test.stall")
    log.addHandler(Capture())
    o = Outage(log, grace=4.0, clock=lambda: now[0])
    assert o.stall == 1.0
    o.ok()
    now[0] += 10
    assert o.connected_for() == 10.0
    o.calling()
    now[0] += 0.5
    o.ok()  # prompt enough
    assert o.connected_for() == pytest.approx(10.5) and o.stalls == 0
    o.calling()
    called, answer = threading.Event(), threading.Event()

    def other_thread() -> None:  # the heartbeats, say: its statements wait too
        o.calling()
        called.set()
        answer.wait(10)
        o.ok()

    other = threading.Thread(target=other_thread)
    other.start()
    assert called.wait(10)
    now[0] += 0.9
    assert o.connected_for() == pytest.approx(11.4)  # waiting, not yet a stall
    now[0] += 19.1
    assert o.connected_for() == 0.0  # still waiting: the database may be stalled right now
    o.ok()
    assert o.connected_for() == 0.0  # the other thread's statements still wait
    now[0] += 0.01
    answer.set()
    other.join(10)
    assert o.stalls == 2 and not o.down and o.reconnects == 0
    now[0] += 3
    assert o.connected_for() == pytest.approx(3.0)
    assert len(logs) == 1 and "took 20.0s to answer" in logs[0], logs
    off = Outage(log, grace=0.0, clock=lambda: now[0])
    off.ok()
    off.calling()
    now[0] += 60
    off.ok()
    assert off.stall is None and off.stalls == 0 and off.connected_for() == 60.0


def test_a_reap_whose_first_statement_is_slow_reaps_nothing(dsn: str) -> None:
    """reap_pinned reaps as reap_expired does when its first statement answers within the
    stall, and leaves every lease alone when it does not."""
    app = fairq.App(dsn)
    try:
        job_id = app.enqueue("t", tenant="a")
        store = app.store
        assert [c.id for c in store.claim(get_policy("fifo"), queue="default", batch=1,
                                          worker="w1")] == [job_id]
        sql(dsn, "UPDATE fairq.jobs SET locked_until = now() - interval '1 second' "
                 "WHERE id = %s", (job_id,))
        assert reap_pinned(store, 10, stall=0.0) is None
        assert sql(dsn, "SELECT status FROM fairq.jobs WHERE id = %s", (job_id,)) == [("running",)]
        result = reap_pinned(store, 10, stall=5.0)
        assert result is not None and [j[0] for j in result.jobs] == [job_id]
        assert sql(dsn, "SELECT status FROM fairq.jobs WHERE id = %s", (job_id,)) == [("queued",)]
    finally:
        app.close()
