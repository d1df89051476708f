"""Apply fairq's Alembic migrations programmatically (``fairq migrate``, ``App.migrate``)."""

from __future__ import annotations

import io
import logging
from pathlib import Path

from alembic.config import Config

from alembic import command
from fairq.config import resolve_schema
from fairq.errors import ConfigurationError

log = logging.getLogger("fairq.migrate")


def migrations_dir() -> Path:
    """The migrations folder: packaged as ``fairq/migrations`` in a wheel, ``alembic/`` in a checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "migrations", here.parent / "alembic"):
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError("fairq's migrations are missing from this installation")


def _config(dsn: str | None, schema: str | None, buffer: io.StringIO | None = None) -> Config:
    cfg = Config(output_buffer=buffer) if buffer is not None else Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.attributes["dsn"] = dsn
    cfg.attributes["schema"] = resolve_schema(schema)
    return cfg


def upgrade(dsn: str, schema: str | None = None, revision: str = "head") -> None:
    """Bring ``schema`` up to ``revision``: idempotent, and safe from many processes at once."""
    command.upgrade(_config(dsn, schema), revision)


def downgrade(dsn: str, schema: str | None = None, revision: str = "base") -> None:
    """Step ``schema`` back to ``revision`` (``base`` removes fairq's tables)."""
    command.downgrade(_config(dsn, schema), revision)


def upgrade_sql(schema: str | None = None, revision: str = "head") -> str:
    """The SQL that ``upgrade`` would run on an empty database, without connecting."""
    buffer = io.StringIO()
    command.upgrade(_config(None, schema, buffer), revision, sql=True)
    return buffer.getvalue()


def current(dsn: str, schema: str | None = None) -> str | None:
    """The revision ``schema`` is at, or None if fairq was never migrated there."""
    import psycopg

    s = resolve_schema(schema)
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL", (f'"{s}".alembic_version',)
        ).fetchone()
        if not row or not row[0]:
            return None
        from psycopg import sql

        got = conn.execute(
            sql.SQL("SELECT version_num FROM {}.alembic_version").format(sql.Identifier(s))
        ).fetchone()
        return str(got[0]) if got else None


def require_current(dsn: str, schema: str | None = None) -> None:
    """Refuse to work on a schema this fairq's statements may not fit: never migrated, or at an
    older revision (``ConfigurationError``: run ``fairq migrate``). A revision this fairq does
    not know, which a newer fairq wrote, only warns: migrations come first in a rolling upgrade,
    and the older workers still running must be able to restart."""
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    s = resolve_schema(schema)
    rev = current(dsn, s)
    if rev is None:
        raise ConfigurationError(
            f"schema {s!r} has no fairq tables: run `fairq migrate` (or App.migrate()) first")
    script = ScriptDirectory.from_config(_config(None, s))
    newest = script.get_current_head()
    if rev == newest:
        return
    try:
        known = script.get_revision(rev) is not None
    except CommandError:
        known = False
    if known:
        raise ConfigurationError(
            f"schema {s!r} is at fairq revision {rev}, this fairq needs {newest}: "
            "run `fairq migrate` first")
    log.warning("schema %r is at fairq revision %s, which this fairq (at %s) does not know: a "
                "newer fairq migrated it; running anyway", s, rev, newest)
