"""The embedded server's lifecycle: start on demand, reuse only what is this install's, stop.

Lifetime policy: like a local development database. ``ensure_server()`` starts the server on
demand and leaves it running after the process exits; the next process (or a concurrent one)
reuses it. No process owns it, so nothing is lost when a process is killed; ``stop_server()``
stops it. A file lock serialises start/stop across processes.

Before reusing a running server we check that it runs this install's binaries (``/proc``, else
the record written at start), that its data is this install's PostgreSQL major version, and that
its socket answers. A server fairq started whose binaries are gone (its checkout was deleted) or
whose socket vanished is stopped and started again on the same data; any other mismatch is one
line saying what to do, and nothing is touched.

Layout, everything under ``$FAIRQ_HOME/embedded/`` (nothing outside it is created-and-chmodded,
except root's shared copy of the binaries, see ``install.py``): ``pgdata/`` (the cluster),
``run/`` (the unix socket, mode 0700: only its owner can connect, which is why trust
authentication is acceptable), ``postgres.log``, ``server.json`` (the binaries it was started
with), ``.lock``. The server listens on the unix socket only, never on TCP.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from fairq.embedded import install, sysuser
from fairq.embedded.install import EmbeddedUnavailable
from fairq.embedded.process import (
    Postmaster,
    accepts,
    executable_of,
    is_postgres,
    pid_alive,
    read_postmaster,
    run_as,
    terminate,
)

DATABASE = "fairq"
ROLE = "postgres"
PORT = 5432  # only names the socket file inside our private run/ folder; no TCP listener
_START_TIMEOUT_S = 60.0
_SOCKET_GRACE_S = 5.0  # "ready" but the socket does not answer for this long: it is gone

_announced: set[Path] = set()
_majors: dict[Path, str] = {}


@dataclass(frozen=True)
class _Paths:
    root: Path  # $FAIRQ_HOME/embedded, the only folder we chown/chmod
    pgdata: Path
    run: Path
    log: Path
    lock: Path
    db_marker: Path
    record: Path

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
            record=root / "server.json",
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
    if user is not None and paths.root.parent.is_relative_to(install.SHARED_ROOT):
        install.make_public_dirs(paths.root.parent)  # root's default: 0755 whatever the umask
    paths.root.mkdir(parents=True, exist_ok=True)
    if user is not None:
        os.chown(paths.root, user.pw_uid, user.pw_gid)
        paths.root.chmod(0o700)


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


def _major_of(bin_dir: Path) -> str:
    """The binaries' PostgreSQL major version (``postgres -V``), once per process."""
    if bin_dir not in _majors:
        done = run_as(None, [str(bin_dir / "postgres"), "-V"], timeout=30)
        _majors[bin_dir] = done.stdout.split()[-1].split(".")[0] if done.returncode == 0 else "?"
    return _majors[bin_dir]


def _check_data_version(paths: _Paths, bin_dir: Path) -> None:
    marker = paths.pgdata / "PG_VERSION"
    if not marker.exists():
        return
    data, ours = marker.read_text().strip(), _major_of(bin_dir)
    if data != ours:
        raise EmbeddedUnavailable(
            f"the embedded data in {paths.pgdata} is PostgreSQL {data} and this install runs "
            f"PostgreSQL {ours}: remove that folder (its data goes) or set FAIRQ_HOME elsewhere"
        )


def _initdb(paths: _Paths, bin_dir: Path, user: pwd.struct_passwd | None) -> None:
    """Init beside the final place, then rename: a killed initdb leaves no half-made cluster."""
    staging = paths.root / "pgdata.init"
    if staging.exists():
        shutil.rmtree(staging)
    done = run_as(user, [
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
    done = run_as(user, [
        str(bin_dir / "pg_ctl"), "start", "-w", "-t", str(int(_START_TIMEOUT_S)),
        "-D", str(paths.pgdata), "-l", str(paths.log), "-o", opts,
    ], timeout=_START_TIMEOUT_S + 10)
    if done.returncode != 0:
        tail = paths.log.read_text(errors="replace")[-2000:] if paths.log.exists() else ""
        raise RuntimeError(
            f"embedded PostgreSQL failed to start: {done.stdout.strip()}\n{paths.log}:\n{tail}"
        )
    paths.record.write_text(json.dumps({"bin_dir": str(bin_dir), "major": _major_of(bin_dir)}))


def _recorded_bin_dir(paths: _Paths) -> Path | None:
    try:
        return Path(json.loads(paths.record.read_text())["bin_dir"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _judge(paths: _Paths, pm: Postmaster, bin_dir: Path) -> str:
    """``ours`` (reuse it), ``stale`` (fairq started it and its binaries are gone: replace it),
    else the one line to raise."""
    recorded = _recorded_bin_dir(paths)
    exe = executable_of(pm.pid)
    if exe is not None:
        if Path(exe) == (bin_dir / "postgres").resolve():
            return "ours"
        gone = exe.endswith(" (deleted)") or not Path(exe).exists()
    elif recorded is not None:
        if recorded == bin_dir:
            return "ours"
        gone = not (recorded / "postgres").exists()
    else:
        gone = False
    if gone and recorded is not None:
        return "stale"
    runs = exe or (str(recorded / "postgres") if recorded else "binaries fairq did not record")
    return (
        f"the embedded PostgreSQL in {paths.pgdata} (pid {pm.pid}) runs {runs}, not this "
        f"install's {bin_dir}: stop it (kill -INT {pm.pid}) or set FAIRQ_HOME to a folder of "
        "this install's own"
    )


def _replace(paths: _Paths, pm: Postmaster, why: str) -> None:
    print(f"fairq: stopping the embedded PostgreSQL (pid {pm.pid}) in {paths.pgdata}: {why}",
          file=sys.stderr)
    if not terminate(pm.pid):
        raise EmbeddedUnavailable(
            f"the embedded PostgreSQL (pid {pm.pid}) in {paths.pgdata} {why} and did not stop: "
            f"kill -9 {pm.pid}, then try again"
        )


def _ensure_database(paths: _Paths, bin_dir: Path, pm: Postmaster) -> None:
    """Create the ``fairq`` database once, so fairq's objects do not land in ``postgres``."""
    if paths.db_marker.exists():
        return
    done = run_as(None, [
        str(bin_dir / "createdb"), "-h", str(pm.socket_dir), "-p", str(pm.port), "-U", ROLE,
        DATABASE,
    ], timeout=60)
    if done.returncode != 0 and "already exists" not in done.stdout:
        raise RuntimeError(f"createdb {DATABASE} failed: {done.stdout.strip()}")
    paths.db_marker.touch()


def _dsn(pm: Postmaster) -> str:
    host = quote(str(pm.socket_dir), safe="/")
    return f"postgresql://{ROLE}@/{DATABASE}?host={host}&port={pm.port}"


def _running(paths: _Paths) -> Postmaster | None:
    pm = read_postmaster(paths.pgdata)
    if pm is not None and is_postgres(pm.pid):
        return pm
    return None


def _serve(paths: _Paths, bin_dir: Path, user: pwd.struct_passwd | None) -> tuple[Postmaster, bool]:
    """Under the lock: a ready server of this install's, started or replaced as needed."""
    started = False
    checked: set[int] = set()
    deadline = time.monotonic() + _START_TIMEOUT_S
    silent_since: float | None = None
    while True:
        pm = _running(paths)
        if pm is None:
            stale = read_postmaster(paths.pgdata)
            if stale is not None and pid_alive(stale.pid):
                # pid reused by an unrelated process: postgres would refuse to start
                (paths.pgdata / "postmaster.pid").unlink()
            _adopt(paths, user)
            if not (paths.pgdata / "PG_VERSION").exists():
                _initdb(paths, bin_dir, user)
            _start(paths, bin_dir, user)
            started = True
            continue
        if pm.pid not in checked:
            verdict = _judge(paths, pm, bin_dir)
            if verdict == "stale":
                _replace(paths, pm, "its binaries are gone")
                continue
            if verdict != "ours":
                raise EmbeddedUnavailable(verdict)
            checked.add(pm.pid)
        if pm.status == "ready":
            if accepts(pm):
                return pm, started
            silent_since = silent_since or time.monotonic()
            if time.monotonic() - silent_since > _SOCKET_GRACE_S:
                _replace(paths, pm, f"its socket {pm.socket_dir} does not answer")
                silent_since = None
                continue
        if time.monotonic() > deadline:  # alive but not accepting (starting/stopping)
            raise RuntimeError(
                f"embedded PostgreSQL (pid {pm.pid}) is not ready after "
                f"{_START_TIMEOUT_S:.0f}s; see {paths.log}"
            )
        time.sleep(0.1)


def _adopt(paths: _Paths, user: pwd.struct_passwd | None) -> None:
    """The server user re-created with other ids (removed by a tool that ignores fairq's lock)
    finds its data owned by a uid no user has now, and PostgreSQL refuses data it does not own:
    give such files to the user. Files of a uid that still names someone are left alone."""
    if user is None:
        return
    try:
        owner = paths.pgdata.stat().st_uid
    except FileNotFoundError:
        return
    if owner == user.pw_uid:
        return
    try:
        pwd.getpwuid(owner)
        return
    except KeyError:
        pass
    print(f"fairq: giving {paths.root} (owned by uid {owner}, which no user has now) to "
          f"{user.pw_name} (uid {user.pw_uid})", file=sys.stderr)
    for dirpath, dirnames, filenames in os.walk(paths.root):
        for name in (*dirnames, *filenames):
            os.lchown(Path(dirpath) / name, user.pw_uid, user.pw_gid)


def _ensure_as(paths: _Paths, user: pwd.struct_passwd | None) -> tuple[Path, Postmaster, bool]:
    """Everything that uses the server user's ids (chown, initdb, pg_ctl), run while they hold."""
    if user is not None:  # before creating anything, then again for what umask gave us
        install.check_reachable(paths.root.parent, user)
    bin_dir = install.usable_bin_dir(user)
    _prepare_folders(paths, user)
    if user is not None:
        install.check_reachable(paths.root, user)
    with _locked(paths):
        _check_data_version(paths, bin_dir)
        pm, started = _serve(paths, bin_dir, user)
        _ensure_database(paths, bin_dir, pm)
    return bin_dir, pm, started


def _ensure_held(paths: _Paths) -> tuple[Path, Postmaster, bool]:
    """``_ensure_as`` under the system user's shared lock; once more with fresh ids if a tool
    that ignores the lock removed or re-created the user meanwhile."""
    for last in (False, True):
        with sysuser.held_server_user() as user:
            try:
                return _ensure_as(paths, user)
            except (RuntimeError, OSError):
                if user is None or last or sysuser.still_valid(user):
                    raise
            print(f"fairq: the system user {user.pw_name} (uid {user.pw_uid}) was removed or "
                  "re-created meanwhile; trying again with its ids now", file=sys.stderr)
    raise AssertionError("unreachable")


def ensure_server(home: Path | None = None) -> str:
    """Start (or reuse) the embedded server under ``home`` and return a DSN to its ``fairq`` db."""
    install.package_bin_dir()  # the install hint before anything else
    paths = _Paths.of((home or install.default_home()).resolve())
    bin_dir, pm, started = _ensure_held(paths)
    dsn = _dsn(pm)
    if paths.root not in _announced:
        _announced.add(paths.root)
        how = "started" if started else "reusing"
        print(
            f"fairq: {how} embedded PostgreSQL {_major_of(bin_dir)} (pid {pm.pid}), data in "
            f"{paths.pgdata}, connect with: psql '{dsn}'  (stop: fairq.embedded.stop_server)",
            file=sys.stderr,
        )
    return dsn


def postmaster_pid(home: Path | None = None) -> int | None:
    """Pid of the running embedded server under ``home``, or None; for status and tests."""
    pm = _running(_Paths.of((home or install.default_home()).resolve()))
    return pm.pid if pm is not None else None


def stop_server(home: Path | None = None) -> bool:
    """Stop the embedded server if it runs; True if it was running.

    Fast shutdown by signal: other processes' sessions are rolled back and disconnected, which is
    what a maintenance stop means; it works whichever binaries the server runs.
    """
    paths = _Paths.of((home or install.default_home()).resolve())
    if not paths.root.exists():
        return False
    with _locked(paths):
        pm = _running(paths)
        if pm is None:
            return False
        if not terminate(pm.pid):
            raise RuntimeError(f"embedded PostgreSQL (pid {pm.pid}) did not stop")
        _announced.discard(paths.root)
        return True
