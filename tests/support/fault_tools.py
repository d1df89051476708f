"""Shared pieces of the fault, chaos, clock and role tests: worker processes, execution logs,
restarting a private cluster, and the invariants every test checks at the end."""

from __future__ import annotations

import contextlib
import dataclasses
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg

from tests.support import pgcluster
from tests.support.paths import REPO, SUPPORT

FAULT_WORKER = SUPPORT / "fault_worker.py"


def sql(dsn: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as c:
        cur = c.execute(query, params)
        return cur.fetchall() if cur.description else []


def wait_for(pred: Callable[[], bool], timeout: float = 60.0, what: str = "condition",
             interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if pred():
                return
        except psycopg.OperationalError:
            pass  # the server may be restarting
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def spawn_worker(dsn: str, log_dir: Path, *args: str, ready: bool = True,
                 timeout: float = 60.0) -> subprocess.Popen[str]:
    """A fault_worker process; its stderr goes to a file (a full pipe would block its logging)."""
    err_path = log_dir / f"worker-{time.monotonic_ns()}.err"
    with err_path.open("w") as err_file:
        p = subprocess.Popen(
            [sys.executable, str(FAULT_WORKER), dsn, "--log-dir", str(log_dir), *args],
            stdout=subprocess.PIPE, stderr=err_file, text=True, cwd=REPO)
    p.err_path = err_path  # type: ignore[attr-defined]
    if ready:
        assert p.stdout is not None
        got, _, _ = select.select([p.stdout], [], [], timeout)
        line = p.stdout.readline() if got else ""
        if not line.startswith("READY"):
            p.kill()
            p.wait(10)
            raise AssertionError(f"worker did not start: {line!r} {err_path.read_text()[-3000:]}")
    return p


def worker_stderr(p: subprocess.Popen[str]) -> str:
    path: Path = p.err_path  # type: ignore[attr-defined]
    return path.read_text(errors="replace")


def stop_worker(p: subprocess.Popen[str], timeout: float = 60.0) -> tuple[str, str]:
    """SIGTERM, then the worker's own output (its STATS line)."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate(timeout=10)
    return out or "", worker_stderr(p)


def stats(out: str) -> dict[str, int]:
    for line in out.splitlines():
        if line.startswith("STATS "):
            return {k: int(v) for k, v in (kv.split("=") for kv in line.split()[1:])}
    raise AssertionError(f"no STATS line in {out!r}")


def executions(log_dir: Path) -> tuple[Counter[int], Counter[int]]:
    """(starts per job id, handler returns per job id) over every worker's log."""
    started: Counter[int] = Counter()
    finished: Counter[int] = Counter()
    for f in log_dir.glob("*.log"):
        for line in f.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:
                started[int(parts[0])] += 1
            elif len(parts) == 3:
                finished[int(parts[0])] += 1
    return started, finished


def check_final_state(dsn: str, job_ids: list[int]) -> None:
    """Every job done, attempts within bounds, and no running slot leaked anywhere."""
    rows = sql(dsn, "SELECT status, count(*), max(attempts), bool_and(attempts <= max_attempts) "
                    "FROM fairq.jobs WHERE id = ANY(%s) GROUP BY status", (job_ids,))
    by_status = {r[0]: r for r in rows}
    assert set(by_status) == {"done"}, f"not all done: {rows}"
    assert by_status["done"][1] == len(job_ids)
    assert by_status["done"][3], "a job ran more attempts than max_attempts"
    leaked = sql(dsn, """
        SELECT ts.queue, ts.tenant, fairq.tenant_running(ts), count(j.id)
        FROM fairq.tenant_schedule ts
        LEFT JOIN fairq.jobs j ON j.queue = ts.queue AND j.tenant = ts.tenant
                              AND j.status = 'running'
        GROUP BY 1, 2, 3 HAVING fairq.tenant_running(ts) <> count(j.id)
                             OR fairq.tenant_running(ts) <> 0""")
    assert leaked == [], f"running slots leaked: {leaked}"


def restart(cluster: pgcluster.Cluster, mode: str = "fast") -> pgcluster.Cluster:
    """Stop the private cluster and start it again on the same port and data directory."""
    cluster.stop(mode)
    log = cluster.datadir.parent / "server.log"
    done = subprocess.run(
        pgcluster._as_user([str(cluster._bin / "pg_ctl"), "-D", str(cluster.datadir), "-l",
                            str(log), "-w", "-t", "60", "start"], cluster.user),
        capture_output=True)
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
        said = (done.stdout + done.stderr).decode(errors="replace").strip()
        raise RuntimeError(f"the private PostgreSQL did not restart on port {cluster.port} "
                           f"(pg_ctl exit {done.returncode}: {said}):\n{tail}")
    pid = int((cluster.datadir / "postmaster.pid").read_text().split()[0])
    new = dataclasses.replace(cluster, pid=pid)
    wait_for(lambda: bool(sql(new.dsn, "SELECT 1")), what="the restarted server")
    return new


@contextlib.contextmanager
def private_cluster(tmp_path: Path, **options: str) -> Iterator[list[pgcluster.Cluster]]:
    """A private cluster in a one-element list (a restart replaces the element), removed after."""
    if not pgcluster.available():
        import pytest

        pytest.skip("PostgreSQL server binaries are not installed")
    holder = [pgcluster.start(tmp_path, options=options or None)]
    try:
        yield holder
    finally:
        holder[0].remove()


def migrated_db(cluster: pgcluster.Cluster, name: str = "fq") -> str:
    from fairq import migrate
    from tests.support.db import dsn_for_db

    sql(cluster.dsn, f'CREATE DATABASE "{name}"')
    dsn = dsn_for_db(cluster.dsn, name)
    migrate.upgrade(dsn, "fairq")
    return dsn
