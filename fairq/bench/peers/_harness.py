"""Shared plumbing for the peer benchmarks: databases, worker processes, wait statistics."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import IO, Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

ADMIN_DSN_ENV = "FAIRQ_PEERS_ADMIN_DSN"
DEFAULT_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"

# Side table filled by the noisy-neighbour runs: one row per job, stamped by the DB clock.
NOISY_TABLE_DDL = """
CREATE TABLE IF NOT EXISTS peer_noisy_jobs (
    job_id      bigint PRIMARY KEY,
    tenant      int NOT NULL,
    enqueued_at timestamptz NOT NULL,
    started_at  timestamptz
)
"""
NOISY_START_SQL = "UPDATE peer_noisy_jobs SET started_at = clock_timestamp() WHERE job_id = $1"
NOISY_START_SQL_PSYCOPG = (
    "UPDATE peer_noisy_jobs SET started_at = clock_timestamp() WHERE job_id = %s"
)


def admin_dsn() -> str:
    """Maintenance DSN for scratch databases: $FAIRQ_PEERS_ADMIN_DSN, $FAIRQ_TEST_DSN, default."""
    return (
        os.environ.get(ADMIN_DSN_ENV) or os.environ.get("FAIRQ_TEST_DSN") or DEFAULT_ADMIN_DSN
    )


def create_database(prefix: str = "peers") -> str:
    """Create an empty database with a random name and return its DSN."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return make_conninfo(admin_dsn(), dbname=name)


def drop_database(dsn: str) -> None:
    """Drop the database named by ``dsn``, disconnecting any leftover session."""
    name = conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(admin_dsn(), autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(str(name)))
        )


@contextlib.contextmanager
def scratch_database(prefix: str = "peers") -> Iterator[str]:
    """Yield the DSN of a fresh random database and drop it afterwards."""
    dsn = create_database(prefix)
    try:
        yield dsn
    finally:
        drop_database(dsn)


def asyncpg_kwargs(dsn: str) -> dict[str, Any]:
    """Translate a libpq DSN (URI or key=value) into ``asyncpg.connect`` keywords."""
    params = conninfo_to_dict(dsn)
    out: dict[str, Any] = {}
    for libpq_key, key in (
        ("host", "host"),
        ("user", "user"),
        ("password", "password"),
        ("dbname", "database"),
    ):
        if params.get(libpq_key):
            out[key] = params[libpq_key]
    if params.get("port"):
        out["port"] = int(str(params["port"]))
    return out


def execute(dsn: str, *statements: str) -> None:
    """Run statements in autocommit mode."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for stmt in statements:
            conn.execute(stmt.encode())


def fetch_value(dsn: str, query: str) -> Any:
    """Return the first column of the first row of ``query``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query.encode()).fetchone()
    return None if row is None else row[0]


def wait_until(
    dsn: str,
    done_query: str,
    timeout_s: float,
    pool: WorkerPool | None = None,
    interval_s: float = 0.02,
) -> float:
    """Poll ``done_query`` (returns a boolean) until true; return the wall time it took.

    With ``pool``, fail fast when a worker crashed or every worker exited with work left.
    """
    start = time.perf_counter()
    all_gone_seen = False
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(done_query.encode()).fetchone()
            if row is not None and row[0]:
                return time.perf_counter() - start
            if pool is not None:
                pool.check_alive_or_clean()
                if all_gone_seen:
                    raise RuntimeError(f"every worker exited before: {done_query}")
                all_gone_seen = pool.all_exited()
            if time.perf_counter() - start > timeout_s:
                raise TimeoutError(f"not done after {timeout_s:.0f}s: {done_query}")
            time.sleep(interval_s)


class WorkerPool:
    """Worker subprocesses that connect, report ``ready``, then start on ``go``.

    Each worker runs ``entry`` (``module:function``) with a JSON config as argv[1]. Every
    process is tracked by PID and terminated on ``close()``, also on error.
    """

    def __init__(self, entry: str, configs: Sequence[dict[str, Any]]) -> None:
        self.entry = entry
        self.configs = list(configs)
        self.procs: list[subprocess.Popen[str]] = []
        self._logs: list[IO[str]] = []

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pids(self) -> list[int]:
        """PIDs of the worker processes started so far."""
        return [p.pid for p in self.procs]

    def start(self, ready_timeout_s: float = 60.0) -> float:
        """Spawn every worker and wait until all are ready; return the spawn time in seconds."""
        module, func = self.entry.split(":")
        code = f"from {module} import {func}; {func}()"
        t0 = time.perf_counter()
        for cfg in self.configs:
            log = tempfile.TemporaryFile(mode="w+", prefix="peer-worker-")  # noqa: SIM115
            self._logs.append(log)
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", code, json.dumps(cfg)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                )
            )
        self._await_lines("ready", ready_timeout_s)
        return time.perf_counter() - t0

    def go(self) -> None:
        """Release every ready worker."""
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()

    def wait_exit(self, timeout_s: float) -> None:
        """Wait for every worker to exit by itself."""
        deadline = time.monotonic() + timeout_s
        for p in self.procs:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))

    def all_exited(self) -> bool:
        """Whether every worker process has exited."""
        return all(p.poll() is not None for p in self.procs)

    def check_alive_or_clean(self) -> None:
        """Raise if a worker has exited with a non-zero status."""
        for i, p in enumerate(self.procs):
            rc = p.poll()
            if rc not in (None, 0):
                raise RuntimeError(f"worker {p.pid} exited {rc}: {self.stderr_tail(i)}")

    def stderr_tail(self, index: int, chars: int = 2000) -> str:
        """Last characters a worker wrote to stderr."""
        log = self._logs[index]
        log.flush()
        log.seek(0)
        return log.read()[-chars:]

    def _await_lines(self, expected: str, timeout_s: float) -> None:
        sel = selectors.DefaultSelector()
        pending: dict[int, int] = {}
        for i, p in enumerate(self.procs):
            assert p.stdout is not None
            sel.register(p.stdout, selectors.EVENT_READ, i)
            pending[i] = p.pid
        deadline = time.monotonic() + timeout_s
        try:
            while pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"workers {sorted(pending.values())} never said {expected}")
                for key, _ in sel.select(timeout=left):
                    i = int(key.data)
                    line = self.procs[i].stdout.readline()  # type: ignore[union-attr]
                    if line.strip() == expected:
                        sel.unregister(key.fileobj)
                        pending.pop(i, None)
                    elif not line:
                        self.procs[i].wait(timeout=5)
                        raise RuntimeError(
                            f"worker {self.procs[i].pid} died before {expected}: "
                            f"{self.stderr_tail(i)}"
                        )
        finally:
            sel.close()

    def close(self, grace_s: float = 5.0) -> None:
        """Terminate (then kill) every worker by PID and release its pipes."""
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
            for stream in (p.stdin, p.stdout):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
        for log in self._logs:
            log.close()
        self._logs.clear()


def worker_config() -> dict[str, Any]:
    """Parse a worker's JSON config from argv[1]."""
    return dict(json.loads(sys.argv[1]))


def say_ready_and_wait_for_go() -> None:
    """Worker side of the handshake: print ``ready`` and block until ``go`` arrives."""
    print("ready", flush=True)
    line = sys.stdin.readline()
    if line.strip() != "go":
        raise SystemExit(0)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for an empty list."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def db_epoch(dsn: str) -> float:
    """The database clock as epoch seconds."""
    return float(fetch_value(dsn, "SELECT EXTRACT(EPOCH FROM clock_timestamp())"))


def noisy_summary(dsn: str, released_epoch: float) -> dict[str, Any]:
    """Per-tenant waits and claim order from ``peer_noisy_jobs``.

    A job's wait runs from ``max(enqueued_at, released)`` (``released`` = when the ready
    workers were let go, so process start-up is not counted) to its start stamp. The claim
    index of a job is its 1-based rank by start stamp across all jobs.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT tenant, EXTRACT(EPOCH FROM started_at"
            " - greatest(enqueued_at, to_timestamp(%s)))::float8,"
            " row_number() OVER (ORDER BY started_at, job_id)"
            " FROM peer_noisy_jobs WHERE started_at IS NOT NULL"
            " ORDER BY started_at, job_id",
            (released_epoch,),
        ).fetchall()
        total = conn.execute(b"SELECT count(*) FROM peer_noisy_jobs").fetchone()
    waits: dict[str, list[float]] = {}
    small_last = 0
    for tenant, wait_s, claim in rows:
        waits.setdefault(str(tenant), []).append(float(wait_s))
        if tenant != 1:
            small_last = max(small_last, int(claim))
    stats = {
        t: {
            "n": len(w),
            "p50_s": percentile(w, 50),
            "p95_s": percentile(w, 95),
            "p99_s": percentile(w, 99),
        }
        for t, w in sorted(waits.items(), key=lambda kv: int(kv[0]))
    }
    small = [x for t, w in waits.items() if t != "1" for x in w]
    return {
        "jobs": int(total[0]) if total else 0,
        "started": len(rows),
        "small_tenants_last_claim_index": small_last,
        "small_tenants_wait": {
            "p50_s": percentile(small, 50),
            "p95_s": percentile(small, 95),
            "p99_s": percentile(small, 99),
        },
        "tenant_wait_stats": stats,
        "tenant_waits_s": dict(sorted(waits.items(), key=lambda kv: int(kv[0]))),
    }
