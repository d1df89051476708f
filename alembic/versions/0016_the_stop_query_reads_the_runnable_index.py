"""claim_settle reads the tenants at the stop through the runnable index

- engine_v10.sql: ``claim_settle`` orders the runnable tenants at the stop's vtime by (vtime,
  tenant), not by tenant alone, so that the primary key (which gives the tenant order too)
  is never read for them when the statistics say tenant_schedule holds one row. Same signature
  and result: workers of the earlier release call it unchanged.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from fairq.schema import engine_functions_ddl

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def _schema() -> str:
    return str(op.get_context().opts["version_table_schema"])


def upgrade() -> None:
    op.execute(sa.text(engine_functions_ddl(_schema(), 10)).execution_options(no_parameters=True))


def downgrade() -> None:
    s = _schema()
    v5 = engine_functions_ddl(s, 5)  # its claim_settle
    start = v5.index(f'CREATE OR REPLACE FUNCTION "{s}".claim_settle(')
    end = v5.index("\n$$;", start) + 4
    op.execute(sa.text(v5[start:end]).execution_options(no_parameters=True))
