"""claim_settle reads the tenants a walk went past in one range, backwards from its stop

- engine_v10.sql: ``claim_settle`` finds the runnable tenants before the walk's stop by one
  backward read of the runnable index from the stop's key, 1,000 at most, instead of two
  forward ranges, one of which the planner read by the primary key when tenant_schedule's
  statistics said it held one row. Same signature and result: workers of the earlier release
  call it unchanged.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-03
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from fairq.schema import engine_functions_ddl

revision = "0017"
down_revision = "0016"
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
