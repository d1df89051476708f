"""job results and periodic schedules

- ``jobs.result`` (jsonb, NULL when the handler returned None or its value could not be
  stored): a done job's return value, written by the same statement that marks it done.
  Adding a nullable column without a default rewrites nothing: instant on a large table.
- ``periodic``: one row per declared schedule (name, tenant) with the last tick enqueued for it.
  Workers claim a tick with a conditional UPDATE (``last_tick < tick``) in the transaction that
  enqueues its job, so two workers can never both enqueue one tick.

Revision ID: 0006
Revises: 0003
Create Date: 2026-11-30
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0006"
down_revision = "0003"
branch_labels = None
depends_on = None


def _schema() -> str:
    return str(op.get_context().opts["version_table_schema"])


def upgrade() -> None:
    s = _schema()
    op.add_column("jobs", sa.Column("result", postgresql.JSONB), schema=s)
    op.create_table(
        "periodic",
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("task", sa.Text, nullable=False),
        sa.Column("cron", sa.Text, nullable=False),
        sa.Column("last_tick", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_job_id", sa.BigInteger),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
        sa.PrimaryKeyConstraint("name", "tenant", name="periodic_pkey"),
        schema=s,
    )


def downgrade() -> None:
    s = _schema()
    op.drop_table("periodic", schema=s)
    op.drop_column("jobs", "result", schema=s)
