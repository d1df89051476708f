"""the fair claim and its settle do the same steps with less per-execution work

- engine_v13.sql: ``claim_fair`` and ``claim_settle`` replaced in place (same signatures and
  results). The pick of a tenant's jobs is an ARRAY subquery instead of five aggregates, at
  every tenant walked; the sleepers' read builds its aggregates only when there are
  sleepers; claim_settle locks the rows to retire in one statement, not two, and skips the
  sleepers' wake-up and the suspects' read when a claim has none. Workers of the earlier
  release call the same functions with the same arguments.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-04
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from fairq.schema import engine_functions_ddl

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def _schema() -> str:
    return str(op.get_context().opts["version_table_schema"])


def _function(ddl: str, create: str) -> str:
    """One function's CREATE statement out of an engine file."""
    start = ddl.index(create)
    return ddl[start:ddl.index("\n$$;", start) + 4]


def upgrade() -> None:
    op.execute(sa.text(engine_functions_ddl(_schema(), 13)).execution_options(no_parameters=True))


def downgrade() -> None:
    s = _schema()
    settle = _function(engine_functions_ddl(s, 10), f'CREATE OR REPLACE FUNCTION "{s}".claim_settle(')
    fair = _function(engine_functions_ddl(s, 12), f'CREATE FUNCTION "{s}".claim_fair(')
    fair = fair.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
    for ddl in (settle, fair):
        op.execute(sa.text(ddl).execution_options(no_parameters=True))
