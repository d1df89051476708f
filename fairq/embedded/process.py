"""The embedded postmaster as a process: its pid file, liveness, binary, socket and signals."""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Postmaster:
    pid: int
    port: int
    socket_dir: Path
    status: str


def run_as(
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


def pid_alive(pid: int) -> bool:
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


def read_postmaster(pgdata: Path) -> Postmaster | None:
    """Parse postmaster.pid; None when absent or unreadable (server not running)."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
    except (FileNotFoundError, PermissionError):
        return None
    try:
        return Postmaster(
            pid=int(lines[0]), port=int(lines[3]), socket_dir=Path(lines[4].strip()),
            status=lines[7].strip() if len(lines) > 7 else "",
        )
    except (IndexError, ValueError):
        return None  # being written right now, or garbage


def is_postgres(pid: int) -> bool:
    """Alive and, where /proc tells, really a postgres (pids are reused after a reboot)."""
    if not pid_alive(pid):
        return False
    comm = Path(f"/proc/{pid}/comm")
    with contextlib.suppress(OSError):
        return comm.read_text().strip() == "postgres"
    return True


def executable_of(pid: int) -> str | None:
    """The binary the process runs, as /proc shows it (``... (deleted)`` once removed); None
    where /proc does not tell (another user's process, no /proc)."""
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def accepts(pm: Postmaster) -> bool:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(2.0)
        sock.connect(str(pm.socket_dir / f".s.PGSQL.{pm.port}"))
        return True
    except OSError:
        return False
    finally:
        sock.close()


def terminate(pid: int, timeout_s: float = 60.0) -> bool:
    """Fast shutdown by signal (SIGINT), which needs none of the server's binaries; True once
    the process is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not pid_alive(pid)
