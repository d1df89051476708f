"""Apply fairq's Alembic migrations programmatically (``fairq migrate``, ``App.migrate``)."""

from __future__ import annotations

import io
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fairq.config import resolve_schema
from fairq.errors import ConfigurationError, InvalidInput

if TYPE_CHECKING:  # Alembic is imported where it is used: a worker's start needs none of it
    from alembic.config import Config
    from alembic.script import ScriptDirectory

log = logging.getLogger("fairq.migrate")
_REVISION = re.compile(r'^(down_revision|revision)\s*=\s*(?:"([^"]*)"|None)\s*$', re.MULTILINE)


def migrations_dir() -> Path:
    """The migrations folder: packaged as ``fairq/migrations`` in a wheel, ``alembic/`` in a checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "migrations", here.parent / "alembic"):
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError("fairq's migrations are missing from this installation")


def _config(dsn: str | None, schema: str | None, buffer: io.StringIO | None = None) -> Config:
    from alembic.config import Config

    cfg = Config(output_buffer=buffer) if buffer is not None else Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.attributes["dsn"] = dsn
    cfg.attributes["schema"] = resolve_schema(schema)
    return cfg


def upgrade(dsn: str, schema: str | None = None,
            revision: str = "head") -> tuple[str | None, str | None]:
    """Bring ``schema`` up to ``revision``: idempotent, and safe from many processes at once.

    Returns (revision before, revision after): equal when there was nothing to do; the first is
    None when fairq's tables were created. Concurrent calls for one schema take turns (a lock
    of their own, held from the first read to the last), so each reports what it did itself:
    one creates the tables, the others find them there.
    """
    import psycopg

    s = resolve_schema(schema)
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as turn:
        # Session-level, on its own connection, and not the migrations' own lock (alembic/env.py
        # takes that in the migration's transaction): released when this connection closes.
        turn.execute("SELECT pg_advisory_lock(hashtext(%s))", (f"fairq.migrate.report.{s}",))
        before = current(dsn, s)
        if before is not None:
            script = _script(s)
            if not _is_known(script, before):
                raise ConfigurationError(
                    f"schema {s!r} is at fairq revision {before!r}, which this fairq (at "
                    f"{script.get_current_head()}) does not know: a newer fairq migrated it, or "
                    "a development build from before this release's baseline (then drop the "
                    "schema and migrate again)")
        from alembic import command

        command.upgrade(_config(dsn, s), revision)
        return before, current(dsn, s)


def downgrade(dsn: str, schema: str | None = None, revision: str = "base") -> None:
    """Step ``schema`` back to ``revision`` (``base`` removes fairq's tables)."""
    from alembic import command

    command.downgrade(_config(dsn, schema), revision)


def upgrade_sql(schema: str | None = None, revision: str = "head",
                start: str | None = None) -> str:
    """The SQL that ``upgrade`` would run from revision ``start`` (None: an empty database),
    without connecting: what a DBA reviews before an upgrade. Empty when ``start`` is already
    ``revision``."""
    if start is not None and start != "base":
        script = _script(schema)
        _known(script, start)
        if start == (script.get_current_head() if revision == "head" else revision):
            return ""
        revision = f"{start}:{revision}"
    buffer = io.StringIO()
    from alembic import command

    command.upgrade(_config(None, schema, buffer), revision, sql=True)
    return buffer.getvalue()


def head() -> str:
    """The revision this fairq's migrations end at: the one its statements expect a schema at."""
    return _script().get_current_head() or "base"


def head_of_files() -> str | None:
    """``head()`` read from the migration files' ``revision``/``down_revision`` lines, without
    Alembic (about a third of a second of imports a worker's start would otherwise pay): the
    one revision no other revises; None if the files do not say it plainly."""
    revisions: set[str] = set()
    revised: set[str] = set()
    for path in (migrations_dir() / "versions").glob("*.py"):
        values = dict((m.group(1), m.group(2)) for m in _REVISION.finditer(path.read_text()))
        if values.get("revision"):
            revisions.add(values["revision"])
            if values.get("down_revision"):
                revised.add(values["down_revision"])
    heads = revisions - revised
    return heads.pop() if len(heads) == 1 else None


def _script(schema: str | None = None) -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_config(None, resolve_schema(schema)))


def _is_known(script: ScriptDirectory, rev: str) -> bool:
    """Whether ``rev`` is a revision of this fairq."""
    from alembic.util import CommandError

    try:
        return script.get_revision(rev) is not None
    except CommandError:
        return False


def _known(script: ScriptDirectory, rev: str) -> None:
    """``InvalidInput`` unless ``rev`` is a revision of this fairq."""
    if not _is_known(script, rev):
        raise InvalidInput(f"unknown fairq revision {rev!r}: this fairq knows "
                           f"{', '.join(r.revision for r in reversed(list(script.walk_revisions())))}")


@dataclass(frozen=True)
class Status:
    """Where a schema stands: its revision, this fairq's head, and the upgrades between."""

    schema: str
    current: str | None                  # None: fairq's tables are not there
    head: str
    pending: list[tuple[str, str]]       # (revision, first line of its description), oldest first
    known: bool                          # False: a newer fairq migrated the schema

    @property
    def up_to_date(self) -> bool:
        return self.current == self.head or not self.known


def status(dsn: str, schema: str | None = None) -> Status:
    """The schema's revision against this fairq's, and what ``upgrade`` would apply."""
    s = resolve_schema(schema)
    script = _script(s)
    head = script.get_current_head() or "base"
    rev = current(dsn, s)
    known = rev is None or _is_known(script, rev)
    pending: list[tuple[str, str]] = []
    if known:
        for r in script.iterate_revisions(head, rev or "base"):
            pending.append((r.revision, (r.doc or "").strip().splitlines()[0] if r.doc else ""))
        pending.reverse()
    return Status(s, rev, head, pending, known)


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
    s = resolve_schema(schema)
    rev = current(dsn, s)
    if rev is None:
        raise ConfigurationError(
            f"schema {s!r} has no fairq tables: run `fairq migrate` (or App.migrate()) first")
    if rev == head_of_files():
        return
    script = _script(s)
    newest = script.get_current_head()
    if rev == newest:
        return
    if _is_known(script, rev):
        raise ConfigurationError(
            f"schema {s!r} is at fairq revision {rev}, this fairq needs {newest}: "
            "run `fairq migrate` first")
    log.warning("schema %r is at fairq revision %s, which this fairq (at %s) does not know: a "
                "newer fairq migrated it; running anyway", s, rev, newest)
