"""settings: row-level security, so that a role other than the owner (the worker) may write
the maintenance stamps but not the tenant defaults (weights and caps). The worker's other
limits are column privileges, granted by ``fairq roles --apply`` (fairq/sql/roles.sql).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from fairq.schema import settings_policy_ddl

revision = "0004"
down_revision = "0006"
branch_labels = None
depends_on = None


def _schema() -> str:
    return str(op.get_context().opts["version_table_schema"])


def upgrade() -> None:
    op.execute(sa.text(settings_policy_ddl(_schema())).execution_options(no_parameters=True))


def downgrade() -> None:
    q = f'"{_schema()}"'
    for policy in ("settings_read", "settings_stamp_insert", "settings_stamp_update"):
        op.execute(sa.text(f"DROP POLICY IF EXISTS {policy} ON {q}.settings"))
    op.execute(sa.text(f"ALTER TABLE {q}.settings DISABLE ROW LEVEL SECURITY"))
