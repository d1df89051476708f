"""PgBouncer in transaction mode: producers, claims, finishes and maintenance go through
the pooler; LISTEN uses its own direct connection (``App(dsn=pooler, listen_dsn=direct)``).
Debian's pgbouncer is 1.18, which does not support protocol-level prepared statements in
transaction mode (``max_prepared_statements`` arrived in 1.21), so fairq runs with
``prepare_threshold=None`` through it; the control test shows that preparing does break there,
i.e. the pool really multiplexes sessions. Our own pgbouncer runs on a free port, stopped by PID.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import fairq
from tests.support import pgcluster
from tests.support.fault_tools import check_final_state, sql, wait_for

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
pytestmark = pytest.mark.skipif(not os.path.exists(PGBOUNCER),
                                reason="pgbouncer not installed (.ci/install-pgbouncer.sh)")


def version() -> tuple[int, int]:
    out = subprocess.run([PGBOUNCER, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"PgBouncer (\d+)\.(\d+)", out)
    assert m, out
    return int(m.group(1)), int(m.group(2))


@pytest.fixture
def pooler(dsn: str, tmp_path: Path) -> Iterator[str]:
    """A transaction-mode pgbouncer in front of the test database: its DSN."""
    target = conninfo_to_dict(dsn)
    port = pgcluster.free_port()
    # in /tmp: pytest's tmp dirs are 0700 root, and pgbouncer runs as the postgres user
    work = Path(tempfile.mkdtemp(prefix="fq-pgbouncer-", dir="/tmp"))
    (work / "users.txt").write_text('"postgres" ""\n')
    ini = work / "pgbouncer.ini"
    ini.write_text(
        "[databases]\n"
        f"{target['dbname']} = host={target.get('host', '127.0.0.1')} "
        f"port={target.get('port', 5432)} dbname={target['dbname']}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {work / 'users.txt'}\n"
        "pool_mode = transaction\ndefault_pool_size = 3\nmax_client_conn = 200\n"
        "admin_users = postgres\nignore_startup_parameters = extra_float_digits,options\n"
        f"logfile = {work / 'pgbouncer.log'}\n")
    for p in (work, *work.iterdir()):
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
        if os.geteuid() == 0:
            shutil.chown(p, "postgres")
    cmd = [PGBOUNCER, str(ini)]
    if os.geteuid() == 0:
        # pgbouncer refuses to run as root; -u (not runuser) keeps our PID the pooler's own
        cmd = [PGBOUNCER, "-u", "postgres", str(ini)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    params = dict(target, port=str(port))
    pooled = make_conninfo(**params)  # type: ignore[arg-type]
    try:
        wait_for(lambda: bool(sql(pooled, "SELECT 1")), timeout=30, what="pgbouncer")
        yield pooled
    finally:
        proc.send_signal(signal.SIGTERM)  # immediate shutdown (SIGINT waits for clients)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)


def test_lifecycle_through_transaction_mode_pgbouncer(pooler: str, dsn: str) -> None:
    assert version() < (1, 21), "newer pgbouncer: add a max_prepared_statements variant"
    app = fairq.App(pooler, listen_dsn=dsn, prepare_threshold=None, pooler=True)
    seen: list[int] = []
    attempts: dict[int, int] = {}
    lock = threading.Lock()

    @app.task(name="t", lease=30)
    def t(job: fairq.Job) -> None:
        job.extend_lease(10)
        with lock:
            seen.append(job.id)

    @app.task(name="flaky", max_attempts=3)
    def flaky(job: fairq.Job) -> None:
        with lock:
            attempts[job.id] = job.attempt
        if job.attempt < 2:
            raise RuntimeError("first try fails")

    app.tenants.set("acme", weight=2.0, max_running=2)
    ids = app.enqueue_many("t", [(f"c{i % 7}", {"i": i}) for i in range(300)])
    ids += app.enqueue_many("t", [("acme", {"i": i}) for i in range(50)])
    flaky_id = flaky.enqueue(tenant="f")
    cancelled = app.enqueue("t", tenant="x", delay=3600)
    assert app.cancel(cancelled)
    w = app.worker(concurrency=8, poll_interval=0.3, reap_interval=0.3)
    th = threading.Thread(target=w.run, daemon=True)
    th.start()
    try:
        assert w.ready.wait(30)
        wait_for(lambda: len(seen) >= len(ids), timeout=120, what="all jobs through the pooler")
        # flaky's retry waits 20 s of backoff: make it due now, as an operator would
        sql(dsn, "UPDATE fairq.jobs SET run_at = now() WHERE id = %s AND status = 'queued'",
            (flaky_id,))
        wait_for(lambda: (app.job(flaky_id) or fairq.App).status == "done",  # type: ignore[union-attr]
                 timeout=60, what="the retried job")
        # LISTEN on the direct connection: with an hour's poll only a NOTIFY brings this one in
        w.poll_interval = 3600.0
        time.sleep(1.0)
        woken = app.enqueue("t", tenant="late")
        wait_for(lambda: woken in seen, timeout=30, what="a NOTIFY wake-up via listen_dsn")
    finally:
        w.stop()
        th.join(30)
        app.close()
    assert sorted(seen) == sorted([*ids, woken])
    assert attempts[flaky_id] == 2
    check_final_state(dsn, [*ids, woken, flaky_id])
    assert w.stats.db_errors == 0
    # the listener is the only direct session fairq kept; the rest went through pgbouncer
    # closed at stop (a backend leaves pg_stat_activity a moment after its client hangs up)
    wait_for(lambda: sql(dsn, "SELECT count(*) FROM pg_stat_activity WHERE application_name "
                              "LIKE 'fairq-worker%%listen' AND datname = current_database()")[0][0] == 0,
             timeout=10, what="the listener's session to end")


def test_prepared_statements_break_through_this_pooler(pooler: str) -> None:
    """The control: psycopg preparing every statement through pgbouncer 1.18 in transaction mode
    fails sooner or later (a prepared statement lands on another server session)."""
    errors = 0
    conns = [psycopg.connect(pooler, autocommit=True, prepare_threshold=0) for _ in range(6)]
    try:
        for i in range(60):
            try:
                conns[i % 6].execute("SELECT %s::int + 1", (i,)).fetchone()
            except (psycopg.errors.DuplicatePreparedStatement,
                    psycopg.errors.InvalidSqlStatementName):
                errors += 1
    finally:
        for c in conns:
            c.close()
    assert errors > 0
