"""The system user root runs the embedded server as: created once, its ids read fresh, held.

Several processes (pytest workers, two demos, a test that removes users) may create, read or
remove the user at once; an id read by one of them and removed by another before use made
``initdb`` fail with "could not look up effective user ID". So every process takes one flock on
``/var/cache/fairq/.users.lock`` (a root-owned folder closed to others): shared while it reads
the ids and runs anything with them (chown, initdb, pg_ctl), exclusive while it creates the user
(or, in tests, removes it); a gate keeps a waiting writer from being starved by readers. The
ids are read from the system database by name each time, after creation too, never kept
across a release of the lock. Tools that ignore the lock (an admin's ``userdel``, a package's
maintainer script) can still change the user: ``still_valid`` tells the caller, who then
retries with fresh ids.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import os
import pwd
import shutil
import subprocess
import time
from collections.abc import Iterator

from fairq.embedded.install import SHARED_ROOT, EmbeddedUnavailable, is_root, make_public_dirs

SYSTEM_USER = "fairq_postgres"
LOCK_DIR = SHARED_ROOT  # root-owned, 0755, checked each time (make_public_dirs)
_LOCK_NAME = ".users.lock"
_GATE_NAME = ".users.gate"
_ATTEMPTS = 5  # created, then removed by someone else before we could read it: that many times
_SHADOW_BUSY_TRIES = 50  # useradd/groupadd find /etc/passwd locked by another tool (apt, ...)
_SHADOW_BUSY_PAUSE_S = 0.1


class SystemUserError(EmbeddedUnavailable):
    """The system user cannot be made; the message is one line saying what to do."""


def _open_lock(name: str) -> int:
    make_public_dirs(LOCK_DIR)
    return os.open(LOCK_DIR / name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


@contextlib.contextmanager
def users_lock(*, exclusive: bool) -> Iterator[None]:
    """The machine-wide lock on fairq's system users; released by the kernel if the holder dies.

    flock lets new shared holders in while an exclusive one waits, so processes that use the
    user in turn would starve one that removes or creates it: everyone passes a gate (a second,
    always exclusive, flock held only to take the main one), which a waiting writer keeps closed.
    Do not nest: taking it while holding it can deadlock with a waiting writer.
    """
    gate, main = _open_lock(_GATE_NAME), _open_lock(_LOCK_NAME)
    try:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(main, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            os.close(gate)
        yield
    finally:
        os.close(main)


def lookup(name: str) -> pwd.struct_passwd | None:
    """The user as the system database has it now, by name; None unless its uid and group
    resolve back (what initdb and setgid need)."""
    try:
        user = pwd.getpwnam(name)
        pwd.getpwuid(user.pw_uid)
        grp.getgrgid(user.pw_gid)
    except KeyError:
        return None
    return user


def still_valid(user: pwd.struct_passwd) -> bool:
    """Whether ``user`` still names the same ids (False: removed or re-created meanwhile)."""
    now = lookup(user.pw_name)
    return now is not None and (now.pw_uid, now.pw_gid) == (user.pw_uid, user.pw_gid)


def _shadow_tool(args: list[str], ok: tuple[int, ...]) -> None:
    """Run useradd/groupadd/userdel/groupdel; codes in ``ok`` (e.g. "already exists") are
    success; a passwd file locked by another tool is waited for."""
    tool = args[0]
    if shutil.which(tool) is None:
        raise SystemUserError(
            f"Running as root needs a user {args[-1]!r} for the embedded server and {tool} is "
            "missing: create that user, run as non-root, or set FAIRQ_DATABASE_URL"
        )
    for _ in range(_SHADOW_BUSY_TRIES):
        done = subprocess.run(args, capture_output=True, text=True, check=False)
        if done.returncode in ok:
            return
        if "try again later" not in done.stderr:  # shadow's "cannot lock /etc/...; try again later"
            break
        time.sleep(_SHADOW_BUSY_PAUSE_S)
    raise SystemUserError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")


def create(name: str) -> None:
    """Under the exclusive lock: the group, then the user in it. Exit 9 ("already exists") is
    success: another tool made it meanwhile, and the caller reads the ids afresh anyway."""
    _shadow_tool(["groupadd", "--system", name], ok=(0, 9))
    _shadow_tool(["useradd", "--system", "--gid", name, "--no-create-home",
                  "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name], ok=(0, 9))


def remove(name: str) -> None:
    """Under the exclusive lock: the user and its group, if there (tests use it)."""
    _shadow_tool(["userdel", name], ok=(0, 6))  # 6: no such user
    _shadow_tool(["groupdel", name], ok=(0, 6))  # 6: no such group (userdel may have removed it)


@contextlib.contextmanager
def held(name: str = SYSTEM_USER) -> Iterator[pwd.struct_passwd]:
    """The user, created if missing, whose ids stay valid for the whole block: the block runs
    under the shared lock, which creating and removing the user take exclusively."""
    for _ in range(_ATTEMPTS):
        with users_lock(exclusive=False):
            user = lookup(name)
            if user is not None:
                yield user
                return
        with users_lock(exclusive=True):
            if lookup(name) is None:
                create(name)
    raise SystemUserError(
        f"the system user {name!r} was removed again each of {_ATTEMPTS} times fairq created it: "
        "stop whatever removes it, or set FAIRQ_DATABASE_URL"
    )


@contextlib.contextmanager
def held_server_user() -> Iterator[pwd.struct_passwd | None]:
    """None when not root; else ``held()``: the account PostgreSQL insists on running as."""
    if not is_root():
        yield None
        return
    with held() as user:
        yield user


def server_user() -> pwd.struct_passwd | None:
    """``held_server_user()`` for a caller that only needs the user to exist (its ids may change
    once returned: run things as it by name, or use ``held_server_user``)."""
    with held_server_user() as user:
        return user
