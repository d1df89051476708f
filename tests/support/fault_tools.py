"""Shared pieces of the fault, chaos, clock and role tests: worker processes, execution logs,
restarting a private cluster, and the invariants every test checks at the end."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
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


# -- outages (tests/runtime/test_outages.py) ---------------------------------------------------
def spans(log_dir: Path) -> dict[int, list[tuple[float, float]]]:
    """Per job id, the (start, end) wall-clock span of every execution that returned, over every
    fault_worker's ``<pid>.spans``."""
    out: dict[int, list[tuple[float, float]]] = {}
    for f in log_dir.glob("*.spans"):
        for line in f.read_text().splitlines():
            job_id, _attempt, start, end = line.split()
            out.setdefault(int(job_id), []).append((float(start), float(end)))
    return out


def overlaps(runs: dict[int, list[tuple[float, float]]]) -> list[int]:
    """Jobs that ran twice at the same time: two executions whose spans overlap."""
    bad = []
    for job_id, spans_ in runs.items():
        ordered = sorted(spans_)
        if any(a[1] > b[0] for a, b in itertools.pairwise(ordered)):
            bad.append(job_id)
    return bad


def hold_down(cluster: pgcluster.Cluster, seconds: float, mode: str = "fast") -> pgcluster.Cluster:
    """Stop the private cluster, keep it down (connections refused) for ``seconds``, start it
    again on the same port: ``restart`` with a gap."""
    cluster.stop(mode)
    time.sleep(seconds)
    return restart(cluster, mode)


class Bouncer:
    """A transaction-mode PgBouncer of our own in front of ``target`` (a DSN), on a fixed free
    port so that a restart (``restart()``: SIGTERM, then start again) keeps its address; stopped
    by PID."""

    def __init__(self, target: str, binary: str) -> None:
        import os
        import shutil
        import tempfile

        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        t = conninfo_to_dict(target)
        self.binary = binary
        self.port = pgcluster.free_port()
        # in /tmp: pytest's tmp dirs are 0700 root, and pgbouncer runs as the postgres user
        self.work = Path(tempfile.mkdtemp(prefix="fq-pgbouncer-", dir="/tmp"))
        (self.work / "users.txt").write_text('"postgres" ""\n')
        self.ini = self.work / "pgbouncer.ini"
        self.ini.write_text(
            "[databases]\n"
            f"{t['dbname']} = host={t.get('host', '127.0.0.1')} port={t.get('port', 5432)} "
            f"dbname={t['dbname']}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.work / 'users.txt'}\n"
            "pool_mode = transaction\ndefault_pool_size = 6\nmax_client_conn = 200\n"
            "admin_users = postgres\nignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.work / 'pgbouncer.log'}\n")
        for p in (self.work, *self.work.iterdir()):
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
            if os.geteuid() == 0:
                shutil.chown(p, "postgres")
        self.dsn = make_conninfo(**dict(t, port=str(self.port)))  # type: ignore[arg-type]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        import os

        cmd = [self.binary, str(self.ini)]
        if os.geteuid() == 0:  # pgbouncer refuses root; -u keeps our PID the pooler's own
            cmd = [self.binary, "-u", "postgres", str(self.ini)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: bool(sql(self.dsn, "SELECT 1")), timeout=30, what="pgbouncer")

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)  # immediate shutdown: every client cut off
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def remove(self) -> None:
        import shutil

        self.stop()
        shutil.rmtree(self.work, ignore_errors=True)


class Producer:
    """A thread enqueueing ``work`` jobs numbered 0, 1, 2, ... one at a time (payload ``{"n": n,
    "ms": ms}``, tenants p0 to p7 in turn) through its own ``fairq.App``, as an application
    would, through an outage or a fail-over. ``acked`` maps each number whose enqueue returned to
    the id it returned (``acked_at``: the wall time it returned); ``unknown`` holds the numbers
    whose enqueue raised (committed or not: the application cannot tell). ``stop()`` ends it."""

    def __init__(self, dsn: str, *, ms: int = 15, every: float = 0.02, **app_options: Any) -> None:
        import threading

        import fairq

        self.app = fairq.App(dsn, **app_options)
        self.ms, self.every = ms, every
        self.acked: dict[int, int] = {}
        self.acked_at: dict[int, float] = {}
        self.unknown: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)

    def start(self) -> Producer:
        self._thread.start()
        return self

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            try:
                job_id = self.app.enqueue("work", tenant=f"p{n % 8}",
                                          payload={"n": n, "ms": self.ms})
            except Exception:  # an outage: the application sees it, and goes on
                self.unknown.append(n)
            else:
                self.acked[n] = job_id
                self.acked_at[n] = time.time()
            n += 1
            self._stop.wait(self.every)

    def acked_since(self, t: float) -> int:
        """How many enqueues returned at or after wall time ``t``."""
        return sum(1 for at in list(self.acked_at.values()) if at >= t)

    def first_ok_after(self, t: float) -> float | None:
        """Seconds from wall time ``t`` to the first enqueue that returned successfully after it."""
        later = [at for at in list(self.acked_at.values()) if at >= t]
        return min(later) - t if later else None

    def stop(self) -> list[int]:
        """Stop (again: a no-op) and close the app; the ids of the enqueues that returned."""
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join(60)
            assert not self._thread.is_alive(), "the producer did not stop"
            self.app.close()
        return list(self.acked.values())


OUTAGE_LINE = "database connection lost"
BACK_LINE = "database connection back after"


def outage_log(stderr: str) -> tuple[int, int, list[float]]:
    """(log lines, lost lines, the seconds each back line says) of one worker's stderr."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    lost = sum(OUTAGE_LINE in ln for ln in lines)
    import re

    back = [float(m.group(1)) for ln in lines
            if (m := re.search(re.escape(BACK_LINE) + r" ([0-9.]+)s", ln))]
    return len(lines), lost, back
