"""job traces: the W3C trace context of a traced enqueue, one row per job

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-07

fairq.otel stores the trace context an enqueue was sent in, for its job's attempts to continue
(docs/tracing.md). This adds the table beside jobs (job_traces: no column of jobs, no change to
the claim or to enqueue_many, so an untraced enqueue costs what it did) and trace_jobs, the
SECURITY DEFINER function every producer writes it through, Python's traced enqueue included.

Self-contained, as 0001 and 0002: it applies the SQL in the folder beside it,
``0003_job_traces/`` (frozen copies: fairq/sql/engine/ is today's text, and moves on). Safe under
0002's workers and producers, which never touch the new objects; its downgrade drops them.
"""
from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from alembic import context, op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

FOLDER = "0003_job_traces"
UPGRADE = ("upgrade.sql", "traces.sql")
DOWNGRADE = ("downgrade.sql",)


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
