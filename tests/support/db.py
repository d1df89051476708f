"""Creating and dropping the throwaway databases the tests (and benchmarks) run in.

Every such database is named ``fairq_test_<machine>_<pid>_<kind>_<random>``: ``<machine>`` is a
short digest of this host's name and boot, ``<pid>`` the process that created it. A run drops its
databases as it goes, a failed test included; a run killed before that leaves them, and the next
run's ``sweep_orphans()`` drops those whose creator process on this machine is gone. Several
pytest processes (pytest-xdist) run at once: each sweeps only databases of dead creators, never
one a live process is using.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import socket
from pathlib import Path

import psycopg
from psycopg import sql

SCHEMA = "fairq"
PREFIX = "fairq_test_"


def _machine() -> str:
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return hashlib.sha256(f"{socket.gethostname()}\0{boot}".encode()).hexdigest()[:4]


MACHINE = _machine()
_NAME = re.compile(rf"^{PREFIX}([0-9a-f]{{4}})_(\d+)_")


def dsn_for_db(admin_dsn: str, dbname: str) -> str:
    """The admin DSN pointed at another database."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(admin_dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)  # type: ignore[arg-type]


def database_name(kind: str) -> str:
    """A new name: the prefix, this machine and process, what it is for, and a random part."""
    kind = re.sub(r"[^a-z0-9_]", "_", kind.lower()).removeprefix("fairq_")[:20]
    return f"{PREFIX}{MACHINE}_{os.getpid()}_{kind}_{secrets.token_hex(5)}"


def create_database(admin_dsn: str, prefix: str, template: str | None = None) -> str:
    """Create a database named by ``database_name(prefix)``; returns its name."""
    name = database_name(prefix)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        if template:
            conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)))
        else:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return name


def drop_database(admin_dsn: str, name: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def orphan(name: str) -> bool:
    """A test database made on this machine by a process that is gone."""
    match = _NAME.match(name)
    return bool(match) and match.group(1) == MACHINE and not _alive(int(match.group(2)))


def sweep_orphans(admin_dsn: str) -> list[str]:
    """Drop the test databases whose creator on this machine is gone; returns their names."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        names = [r[0] for r in conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE %s", [PREFIX + "%"])]
    dropped = []
    for name in filter(orphan, names):
        try:
            drop_database(admin_dsn, name)
        except psycopg.Error:
            continue  # another process is sweeping the same one
        dropped.append(name)
    return dropped
