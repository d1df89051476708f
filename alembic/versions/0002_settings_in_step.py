"""settings in step: settings locks, schedule rows repaired, settings versions

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-07

A tenant's schedule rows copy its settings; 0001 let an enqueue creating a tenant's first row and
a change of its settings miss each other, and a `tenants delete` racing an enqueue leave a job
with no row (decision 020). This adds the settings locks both sides take (lock_settings), the row
creation they share (ensure_schedule) and the maintenance's repair (repair_schedule), replaces
enqueue_many (same arguments, same result) to take the locks, and counts each tenant's settings
changes (tenants.version, a trigger) so a person's edit can be refused when another came first.

Self-contained, as 0001: it applies the SQL in the folder beside it, ``0002_settings_in_step/``
(frozen copies: fairq/sql/engine/ is today's text, and moves on), and its downgrade puts 0001's
enqueue_many back from its own copy.
"""
from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from alembic import context, op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

FOLDER = "0002_settings_in_step"
UPGRADE = ("upgrade.sql", "settings.sql", "enqueue.sql")
DOWNGRADE = ("downgrade.sql", "downgrade_enqueue.sql")


def _schema() -> str:
    return str(op.get_context().opts["version_table_schema"])


def _folder() -> Traversable:
    """This migration's SQL: package data of ``fairq.migrations.versions`` in an installed fairq,
    beside this file in a checkout."""
    try:
        return resources.files("fairq.migrations.versions").joinpath(FOLDER)
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent / FOLDER


def _run(files: tuple[str, ...]) -> None:
    s = _schema()
    for name in files:
        text = _folder().joinpath(name).read_text(encoding="utf-8")
        ddl = text.replace("{schema}", f'"{s}"').replace("{channel}", f"'fairq_{s}'")
        if context.is_offline_mode():
            # Written as is (op.execute would double each %, as the online path must not).
            op.get_context().impl.static_output(ddl.rstrip() + "\n")
        else:
            # On the driver's connection, in the migration's transaction: the text reaches
            # PostgreSQL as written (SQLAlchemy's text() would double each %).
            op.get_bind().connection.driver_connection.execute(ddl)  # type: ignore[union-attr]


def upgrade() -> None:
    _run(UPGRADE)


def downgrade() -> None:
    _run(DOWNGRADE)
