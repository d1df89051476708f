"""worker registry: the live workers and the queues they serve

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-05

Each worker writes its row at start and at every beat (fairq/runtime/registry.py) and deletes it
at a clean stop; a worker that missed its beats is dead to the readers (``fairq tenants
explain``'s ``no_worker``, docs/explain.md). Self-contained: no function changes, and the
downgrade drops the table.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _schema() -> str:
    return str(op.get_context().opts["version_table_schema"])


def upgrade() -> None:
    ts = sa.DateTime(timezone=True)
    op.create_table(
        "workers",
        sa.Column("worker_id", sa.Text, nullable=False),
        sa.Column("queues", postgresql.ARRAY(sa.Text), nullable=False),
        sa.Column("policy", sa.Text, nullable=False),
        sa.Column("beat_seconds", sa.Float, nullable=False),
        sa.Column("started_at", ts, nullable=False, server_default=sa.text("now()")),
        sa.Column("seen_at", ts, nullable=False, server_default=sa.text("now()")),
        sa.PrimaryKeyConstraint("worker_id", name="workers_pkey"),
        sa.CheckConstraint("beat_seconds > 0", name="workers_beat_seconds_check"),
        schema=_schema(),
    )


def downgrade() -> None:
    op.drop_table("workers", schema=_schema())
