"""Recovery in seconds from a connection storm: two `fairq worker` processes (4 slots each,
``/readyz`` served) drain 2,000 jobs (lease 10 s) while every session they hold is ended with
``pg_terminate_backend`` every 200 ms for 10 s. Every job ends done, no job runs twice at the
same time (each execution logs its start and end), and within a few seconds of the last kill
each worker claims again and answers ``/readyz`` with 200, and the storm was a few lines in
each worker's log, not one per killed session (it wrote 1,930 lines in such a storm before a
lost connection was logged once per outage). The figures are printed.

Without the pool check after a lost connection a worker took its pool's dead connections one
failure at a time, its backoff growing with each, and came back many seconds later.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import fairq
from tests.support.fault_tools import sql, wait_for

JOBS = 2000
STORM_SECONDS = 10.0
RECOVERY_LIMIT = 5.0  # seconds after the storm: a worker claims again, /readyz says 200
LOG_LINES_LIMIT = 12  # per worker for the whole run: start, stop, and the storm's few lines

TASKS = """\
import os
import time

import fairq

app = fairq.App()
LOG = os.environ["STORM_LOG"]


@app.task(name="storm.work", lease=10, max_attempts=20)
def work(job):
    start = time.time()
    time.sleep(job.payload["ms"] / 1000.0)
    with open(f"{LOG}/{os.getpid()}.log", "a") as f:
        f.write(f"{job.id} {job.attempt} {start:.6f} {time.time():.6f}\\n")
"""

KILL = ("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE datname = current_database() AND application_name LIKE 'fairq-worker%'")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
            return int(r.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def executions(log_dir: Path) -> dict[str, list[tuple[int, int, float, float]]]:
    """Per worker process: (job id, attempt, start, end) of every execution."""
    out: dict[str, list[tuple[int, int, float, float]]] = {}
    for f in log_dir.glob("*.log"):
        rows = []
        for line in f.read_text().splitlines():
            i, a, s, e = line.split()
            rows.append((int(i), int(a), float(s), float(e)))
        out[f.stem] = rows
    return out


@pytest.mark.timeout(300)
def test_workers_recover_within_seconds_of_a_connection_storm(dsn: str, tmp_path: Path) -> None:
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    (tmp_path / "storm_tasks.py").write_text(TASKS)
    env = {**os.environ, "FAIRQ_DATABASE_URL": dsn, "STORM_LOG": str(log_dir)}
    ports = [free_port(), free_port()]
    workers = [subprocess.Popen(
        [sys.executable, "-m", "fairq", "worker", "storm_tasks:app", "--concurrency", "4",
         "--metrics-port", str(port), "--poll-interval", "1"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
        stderr=(tmp_path / f"worker-{port}.err").open("w")) for port in ports]
    try:
        wait_for(lambda: all(ready(p) for p in ports), timeout=60, what="both workers ready")
        with fairq.App(dsn) as app:
            app.task(lambda job: None, name="storm.work", lease=10, max_attempts=20)
            ids = app.enqueue_many("storm.work", [(f"t{i % 20}", {"ms": 40})
                                                  for i in range(JOBS)])
        kills = 0
        storm_end = time.monotonic() + STORM_SECONDS
        while time.monotonic() < storm_end:
            kills += int(sql(dsn, KILL)[0][0])
            time.sleep(0.2)
        ended_wall, ended = time.time(), time.monotonic()
        left = int(sql(dsn, "SELECT count(*) FROM fairq.jobs WHERE status = 'queued'")[0][0])
        back: dict[int, float] = {}
        while len(back) < len(ports) and time.monotonic() - ended < 30:
            for p in ports:
                if p not in back and ready(p):
                    back[p] = time.monotonic() - ended
            time.sleep(0.05)
        wait_for(lambda: sql(dsn, "SELECT count(*) FROM fairq.jobs WHERE status <> 'done'")
                 [0][0] == 0, timeout=120, what="every job done")
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            try:
                w.wait(60)
            except subprocess.TimeoutExpired:
                w.kill()
    runs = executions(log_dir)
    first_after = {pid: min((s for _, _, s, _ in rows if s >= ended_wall), default=None)
                   for pid, rows in runs.items()}
    claims_back = {pid: None if t is None else t - ended_wall for pid, t in first_after.items()}
    log_lines = {p.name: len(p.read_text().splitlines()) for p in tmp_path.glob("worker-*.err")}
    print(f"\n{kills} sessions ended in {STORM_SECONDS:.0f} s; {left} jobs queued at the storm's "
          f"end; /readyz 200 again after {back} s; first job started after "
          f"{claims_back} s; log lines per worker {sorted(log_lines.values())}")
    assert kills > 50, "the storm ended too few sessions to be one"
    assert left > 0, "the jobs were all claimed during the storm: nothing to recover for"
    by_job: dict[int, list[tuple[float, float]]] = {}
    for rows in runs.values():
        for i, _, s, e in rows:
            by_job.setdefault(i, []).append((s, e))
    assert set(by_job) == set(ids)
    overlapping = [i for i, spans in by_job.items()
                   if any(a[1] > b[0] for a, b in zip(sorted(spans), sorted(spans)[1:],
                                                      strict=False))]
    assert overlapping == [], f"jobs run twice at the same time: {overlapping[:10]}"
    assert len(back) == len(ports) and max(back.values()) <= RECOVERY_LIMIT, back
    assert len(claims_back) == len(ports)
    assert all(t is not None and t <= RECOVERY_LIMIT for t in claims_back.values()), claims_back
    assert len(log_lines) == len(ports) and max(log_lines.values()) <= LOG_LINES_LIMIT, \
        {p.name: p.read_text()[-3000:] for p in tmp_path.glob("worker-*.err")}
