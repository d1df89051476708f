"""a served tenant's last due job and its retirement in one row write

- engine_v4.sql: a new ``claim_settle`` (same signature). A served tenant without a rate limit
  that has no due job left is retired by the row write that counts its claimed jobs, under a
  FOR UPDATE lock taken first (SKIP LOCKED), instead of by a second write after locking and
  probing it again. One-job tenants cost three row writes per job instead of four.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""
from __future__ import annotations

from importlib import resources

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def _schema() -> str:
    return str(op.get_context().opts["version_table_schema"])


def _ddl(version: int) -> str:
    return resources.files("fairq.sql").joinpath(f"ddl/engine_v{version}.sql").read_text(
        encoding="utf-8")


def upgrade() -> None:
    s = _schema()
    op.execute(sa.text(_ddl(4).replace("{schema}", f'"{s}"'))
               .execution_options(no_parameters=True))


def downgrade() -> None:
    v3 = _ddl(3)  # its claim_settle
    start = v3.index("CREATE OR REPLACE FUNCTION {schema}.claim_settle(")
    end = v3.index("\n$$;", start) + 4
    op.execute(sa.text(v3[start:end].replace("{schema}", f'"{_schema()}"'))
               .execution_options(no_parameters=True))
