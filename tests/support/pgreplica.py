"""A private primary and a streaming standby of it, for the fail-over tests.

    pair = pgreplica.start(tmp_path, mode="sync")   # or "async"
    request.addfinalizer(pair.remove)
    dsn = pair.url("fq")        # postgresql://...:standby,...:primary/fq?target_session_attrs=read-write
    pair.cut_stream()           # (async) the standby falls behind: a replication lag
    pair.promote()              # pg_ctl promote: the standby takes writes
    pair.kill_primary()         # the old primary dies (immediate shutdown)

The primary is a private cluster (tests/support/pgcluster.py: a free port, Debian's binaries, as
the ``postgres`` OS user when run as root) with ``synchronous_commit = on``. The standby is made
with ``pg_basebackup -R`` from it (so it streams from it, with ``standby.signal``) and runs on a
port of its own. ``mode="sync"`` names the standby in the primary's ``synchronous_standby_names``:
a commit returns once the standby has flushed it. The standby's own ``synchronous_standby_names``
is empty: the copy of the primary's settings must not make the promoted server wait for a standby
it does not have. ``remove`` stops exactly the two postmasters started here (by PID).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from tests.support import pgcluster

STANDBY_NAME = "fq_standby"


@dataclass
class Pair:
    primary: pgcluster.Cluster
    standby: pgcluster.Cluster
    mode: str  # "sync" or "async"

    def url(self, db: str = "postgres") -> str:
        """The multi-host URL clients get: the standby first, so a client that ignored
        ``target_session_attrs`` would land on a read-only server before the promotion."""
        return (f"postgresql://postgres@127.0.0.1:{self.standby.port},"
                f"127.0.0.1:{self.primary.port}/{db}?target_session_attrs=read-write"
                "&connect_timeout=5")

    def promote(self, timeout: float = 60.0) -> None:
        """``pg_ctl promote -w``: returns once the standby accepts writes."""
        done = subprocess.run(
            pgcluster._as_user([str(self.standby._bin / "pg_ctl"), "-D", str(self.standby.datadir),
                                "-w", "-t", str(int(timeout)), "promote"], self.standby.user),
            capture_output=True)
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl promote failed ({done.returncode}): "
                               f"{(done.stdout + done.stderr).decode(errors='replace')}")
        deadline = time.monotonic() + timeout
        while in_recovery(self.standby.dsn):
            if time.monotonic() > deadline:
                raise RuntimeError("the standby did not leave recovery")
            time.sleep(0.05)

    def kill_primary(self) -> None:
        """The old primary's death: an immediate shutdown (SIGQUIT to its postmaster)."""
        self.primary.stop("immediate")

    def cut_stream(self, timeout: float = 30.0) -> None:
        """Stop the standby's streaming, the standby staying up: it falls behind from now on,
        as an asynchronous standby under lag (an empty ``primary_conninfo``, reloaded)."""
        with psycopg.connect(self.standby.dsn, autocommit=True) as c:
            c.execute("ALTER SYSTEM SET primary_conninfo = ''")
            c.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + timeout
        while True:
            with psycopg.connect(self.primary.dsn, autocommit=True) as c:
                if not c.execute("SELECT 1 FROM pg_stat_replication WHERE application_name = %s",
                                 (STANDBY_NAME,)).fetchall():
                    return
            if time.monotonic() > deadline:
                raise RuntimeError("the standby still streams")
            time.sleep(0.05)

    def stop_standby(self) -> None:
        """Stop the standby (fast): what the primary commits meanwhile never reaches it."""
        self.standby.stop("fast")

    def start_standby(self) -> None:
        """Start the standby again (it streams again if the primary is up)."""
        self.standby = _pg_ctl_start(self.standby)

    def remove(self) -> None:
        for cluster in (self.standby, self.primary):
            with contextlib.suppress(Exception):
                cluster.stop("immediate")  # throwaway: nothing to flush
                cluster.remove()


def available() -> bool:
    """Whether the server binaries, pg_basebackup included, are installed."""
    d = pgcluster.bindir()
    return pgcluster.available() and d is not None and (d / "pg_basebackup").exists()


def in_recovery(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as c:
        row = c.execute("SELECT pg_is_in_recovery()").fetchone()
        return bool(row and row[0])


def start(workdir: Path, *, mode: str = "async", timeout: float = 60.0) -> Pair:
    """A primary and a streaming standby of it, replicating in ``mode`` ("sync" or "async")."""
    if mode not in ("sync", "async"):
        raise ValueError(f"mode must be 'sync' or 'async', not {mode!r}")
    primary = pgcluster.start(workdir, options={"synchronous_commit": "on",
                                                "wal_level": "replica", "max_wal_senders": "5",
                                                "wal_keep_size": "64MB"}, timeout=timeout)
    try:
        standby = _basebackup(primary, workdir, timeout)
    except BaseException:
        primary.remove()
        raise
    pair = Pair(primary, standby, mode)
    try:
        _wait_streaming(primary.dsn, timeout)
        if mode == "sync":
            with psycopg.connect(primary.dsn, autocommit=True) as c:
                c.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'")
                c.execute("SELECT pg_reload_conf()")
            _wait_streaming(primary.dsn, timeout, sync_state="sync")
    except BaseException:
        pair.remove()
        raise
    return pair


def _basebackup(primary: pgcluster.Cluster, workdir: Path, timeout: float) -> pgcluster.Cluster:
    """``pg_basebackup -R`` of ``primary`` into a new data directory, started as a standby."""
    user = primary.user
    root, sockdir = pgcluster.server_dirs(workdir, user, "pgstandby")
    datadir = root / "data"
    conninfo = (f"host=127.0.0.1 port={primary.port} user=postgres "
                f"application_name={STANDBY_NAME}")
    done = subprocess.run(
        pgcluster._as_user([str(primary._bin / "pg_basebackup"), "-D", str(datadir), "-d",
                            conninfo, "-R", "-X", "stream", "--no-sync", "-c", "fast"], user),
        capture_output=True, timeout=timeout)
    if done.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"pg_basebackup failed ({done.returncode}): "
                           f"{(done.stdout + done.stderr).decode(errors='replace')[-2000:]}")
    port = pgcluster.free_port()
    with (datadir / "postgresql.auto.conf").open("a") as f:  # later lines win
        f.write(f"port = '{port}'\nunix_socket_directories = '{sockdir}'\n"
                "synchronous_standby_names = ''\nhot_standby = 'on'\n")
    standby = pgcluster.Cluster(datadir, port, 0, user, primary._bin, sockdir)
    return _pg_ctl_start(standby, timeout)


def _pg_ctl_start(cluster: pgcluster.Cluster, timeout: float = 60.0) -> pgcluster.Cluster:
    log = cluster.datadir.parent / "server.log"
    done = subprocess.run(
        pgcluster._as_user([str(cluster._bin / "pg_ctl"), "-D", str(cluster.datadir), "-l",
                            str(log), "-w", "-t", str(int(timeout)), "start"], cluster.user),
        capture_output=True)
    pidfile = cluster.datadir / "postmaster.pid"
    if done.returncode != 0 or not pidfile.exists():
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
        raise RuntimeError(f"the standby did not start on port {cluster.port}:\n{tail}")
    started = pgcluster.Cluster(cluster.datadir, cluster.port,
                                int(pidfile.read_text().split()[0]), cluster.user, cluster._bin,
                                cluster.sockdir)
    if not pgcluster._wait_accepting(started.dsn, timeout):
        started.stop("immediate")
        raise RuntimeError(f"the standby on port {cluster.port} does not accept connections")
    return started


def _wait_streaming(primary_dsn: str, timeout: float, sync_state: str | None = None) -> None:
    """Until the primary streams to the standby (in ``sync_state``, when given)."""
    deadline = time.monotonic() + timeout
    while True:
        with psycopg.connect(primary_dsn, autocommit=True) as c:
            rows = c.execute("SELECT state, sync_state FROM pg_stat_replication "
                             "WHERE application_name = %s", (STANDBY_NAME,)).fetchall()
        if any(r[0] == "streaming" and (sync_state is None or r[1] == sync_state) for r in rows):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the standby is not streaming ({sync_state or 'any'}): {rows}")
        time.sleep(0.05)


def wait_replayed(primary_dsn: str, standby_dsn: str, timeout: float = 30.0) -> None:
    """Until the standby has replayed everything the primary has written so far."""
    with psycopg.connect(primary_dsn, autocommit=True) as c:
        row = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    target = row[0]
    deadline = time.monotonic() + timeout
    with psycopg.connect(standby_dsn, autocommit=True) as s:
        while True:
            got = s.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn",
                            (target,)).fetchone()
            if got and got[0]:
                return
            if time.monotonic() > deadline:
                raise RuntimeError("the standby did not catch up")
            time.sleep(0.05)
