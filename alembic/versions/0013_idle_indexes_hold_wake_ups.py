"""the idle-tenant indexes hold only tenants with a wake-up (wake_at IS NOT NULL)

Why: a tenant leaves the runnable set when its last due job is claimed. With no delayed job
its ``wake_at`` is NULL, and nothing ever looks an idle tenant up by a NULL ``wake_at``, yet
both idle-tenant indexes (``tenant_schedule_due_idx`` (queue, wake_at) and
``tenant_schedule_wake_idx`` (wake_at), ``WHERE NOT active``) took an entry for it when it was
retired and again at each finish of its running jobs: with one-job tenants, three index
entries a row write where fifo, whose tenants stay runnable, writes two. Their readers (the
claim's sleepers, ``next_wake``, ``wake_due_tenants``) ask ``wake_at <= now()`` or ``wake_at IS
NOT NULL``, which imply the new predicate. ``wake_stranded_tenants``, the rare safety net that
reads every idle tenant, reads the table instead, as it must now see the tenants these indexes
leave out.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

INDEXES = {"tenant_schedule_due_idx": ["queue", "wake_at"], "tenant_schedule_wake_idx": ["wake_at"]}


def _schema() -> str:
    return str(op.get_context().opts["version_table_schema"])


def _replace(where: str) -> None:
    # Built beside the old index, then swapped; tenant_schedule has a row per tenant and queue,
    # so the build is short, and blocks writes to that table until the commit.
    s = _schema()
    for name, columns in INDEXES.items():
        op.create_index(f"{name}_new", "tenant_schedule", columns, schema=s,
                        postgresql_where=sa.text(where))
        op.drop_index(name, table_name="tenant_schedule", schema=s)
        op.execute(sa.text(f'ALTER INDEX "{s}".{name}_new RENAME TO {name}'))


def upgrade() -> None:
    _replace("NOT active AND wake_at IS NOT NULL")


def downgrade() -> None:
    _replace("NOT active")
