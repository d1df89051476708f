"""A private, throwaway PostgreSQL cluster: for tests that need server settings or a dead server.

    cluster = pgcluster.start(tmp_path, options={"shared_preload_libraries": "pg_stat_statements"})
    request.addfinalizer(cluster.stop)
    psycopg.connect(cluster.dsn)

Runs Debian's PostgreSQL binaries (``/usr/lib/postgresql/<ver>/bin``, ``$FAIRQ_PG_BINDIR``
overrides; without either, the embedded package's) on a free loopback port with trust auth.
PostgreSQL refuses to run as root, so when the tests run as root the cluster runs as the
``postgres`` OS user (or, where there is none, the embedded server's). ``stop`` stops exactly this
cluster (by its postmaster PID), never anything else.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psycopg


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out to outgoing connections (32768 by default)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A free port below the kernel's ephemeral range. A port in that range can be taken while
    its server is down by a client retrying it: an outgoing connection to 127.0.0.1:P from the
    local port P connects to itself (TCP simultaneous open) and holds P, and the restarted
    server cannot bind: the likely cause of a restart in test_health's outage that failed once
    (its server log was gone; a failed restart now shows it, fault_tools.restart)."""
    high = _ephemeral_low() - 1
    for _ in range(200):
        port = random.randint(max(1024, high - 12_000), high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def bindir() -> Path | None:
    """Where initdb/pg_ctl live: ``$FAIRQ_PG_BINDIR`` or the newest Debian install."""
    if env := os.environ.get("FAIRQ_PG_BINDIR"):
        return Path(env)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).parent
    return _embedded_bindir()


def _embedded_bindir() -> Path | None:
    """The embedded package's own initdb/pg_ctl: a machine without a PostgreSQL install runs
    the private-cluster tests on them."""
    try:
        from fairq.embedded import _bin_dir

        return _bin_dir()
    except Exception:
        return None


def _server_user() -> str | None:
    """The OS user the cluster runs as: None unless root; then ``postgres`` if it exists, else
    the embedded server's own unprivileged user (created on first use)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
        return "postgres"
    except KeyError:
        from fairq.embedded import _server_user as embedded_user

        user = embedded_user()
        return user.pw_name if user else None


def available() -> bool:
    d = bindir()
    return d is not None and (d / "initdb").exists() and (d / "pg_ctl").exists()


@dataclass
class Cluster:
    datadir: Path
    port: int
    pid: int
    user: str | None  # OS user the server runs as (None: the current user)
    _bin: Path
    sockdir: Path

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def running(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return not _zombie(self.pid)

    def stop(self, mode: str = "fast", timeout: float = 30.0) -> None:
        """Stop this cluster's postmaster (SIGINT = fast shutdown, SIGQUIT = immediate)."""
        if not self.running():
            return
        sig = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}[mode]
        os.kill(self.pid, sig)
        deadline = time.monotonic() + timeout
        while self.running() and time.monotonic() < deadline:
            _reap(self.pid)
            time.sleep(0.05)
        if self.running():
            os.kill(self.pid, signal.SIGKILL)
            time.sleep(0.2)
        _reap(self.pid)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.datadir.parent, ignore_errors=True)
        shutil.rmtree(self.sockdir, ignore_errors=True)


def _zombie(pid: int) -> bool:
    """Whether ``pid`` exited and waits to be reaped: a postmaster started by pg_ctl is not our
    child, and the init process of a container may reap it a second or more later."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _as_user(cmd: list[str], user: str | None) -> list[str]:
    return ["runuser", "-u", user, "--", *cmd] if user else cmd


def server_dirs(workdir: Path, user: str | None, name: str) -> tuple[Path, Path]:
    """A new folder for a server's data (``name``: its prefix) and one for its socket."""
    # Unix socket paths are limited to 107 bytes: pytest's tmp paths are too long for them.
    sockdir = Path(tempfile.mkdtemp(prefix="fqpg-", dir="/tmp"))
    if user:
        # As root the server runs as `user`, which must reach its data directory for as long as
        # the cluster lives. Not under pytest's tmp folders: every pytest session that starts
        # (another xdist worker, another run) makes /tmp/pytest-of-<user> private again, and a
        # restart would then fail with "could not access directory". /var/tmp is traversable.
        root = Path(tempfile.mkdtemp(prefix=f"fairq-{name}-", dir="/var/tmp"))
        pw = pwd.getpwnam(user)
        for d in (root, sockdir):
            os.chown(d, pw.pw_uid, pw.pw_gid)
    else:
        root = Path(workdir) / f"{name}-{os.getpid()}-{time.monotonic_ns()}"
        root.mkdir(parents=True)
    return root, sockdir


def start(workdir: Path, *, port: int | None = None, options: Mapping[str, str] | None = None,
          timeout: float = 60.0) -> Cluster:
    """initdb a new cluster under ``workdir`` (as root, under /var/tmp: see below) and start it;
    returns once it accepts connections.

    ``options`` are server settings (``shared_preload_libraries``, ``max_connections``, ...).
    """
    bin_dir = bindir()
    if bin_dir is None:
        raise FileNotFoundError("PostgreSQL server binaries not found (set FAIRQ_PG_BINDIR)")
    user = _server_user()
    root, sockdir = server_dirs(workdir, user, "pgcluster")
    datadir = root / "data"
    subprocess.run(
        _as_user([str(bin_dir / "initdb"), "-D", str(datadir), "-U", "postgres", "-A", "trust",
                  "--no-sync", "-E", "UTF8", "--locale=C"], user),
        check=True, capture_output=True,
    )
    settings = {"listen_addresses": "127.0.0.1", "unix_socket_directories": str(sockdir),
                "fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
                **dict(options or {})}
    with (datadir / "postgresql.auto.conf").open("a") as f:
        for key, value in settings.items():
            f.write(f"{key} = '{value}'\n")
    last_error = ""
    for _attempt in range(3):  # a free port can be taken between probe and bind
        chosen = port or free_port()
        with (datadir / "postgresql.auto.conf").open("a") as f:
            f.write(f"port = '{chosen}'\n")
        log = root / "server.log"
        subprocess.run(
            _as_user([str(bin_dir / "pg_ctl"), "-D", str(datadir), "-l", str(log), "-w",
                      "-t", str(int(timeout)), "start"], user),
            capture_output=True,
        )
        pidfile = datadir / "postmaster.pid"
        if pidfile.exists():
            pid = int(pidfile.read_text().split()[0])
            cluster = Cluster(datadir, chosen, pid, user, bin_dir, sockdir)
            if _wait_accepting(cluster.dsn, timeout):
                return cluster
            cluster.stop("immediate")
        last_error = log.read_text(errors="replace") if log.exists() else "(no log)"
        if port is not None or "already in use" not in last_error:
            break
    raise RuntimeError(f"private PostgreSQL did not start:\n{last_error[-3000:]}")


def _wait_accepting(dsn: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            psycopg.connect(dsn, connect_timeout=2).close()
            return True
        except psycopg.OperationalError:
            time.sleep(0.1)
    return False
