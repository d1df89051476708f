"""the fair claim is one function whose walk is a loop, running only the steps a claim needs

- engine_v12.sql: ``claim_fair``, which claim.sql's claim_fair statement calls. The statement
  it replaces held every step as a CTE, and PostgreSQL started all 72 nodes of its plan at
  every claim; the function runs the sleepers, the reach, one FETCH and one pick per tenant
  walked, and the wait, the stop and drr's cost only when a claim needs them. Workers of the
  earlier release keep sending their own statement, which calls the functions it did.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-04
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from fairq.schema import engine_functions_ddl

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def _schema() -> str:
    return str(op.get_context().opts["version_table_schema"])


def upgrade() -> None:
    op.execute(sa.text(engine_functions_ddl(_schema(), 12)).execution_options(no_parameters=True))


def downgrade() -> None:
    op.execute(f'DROP FUNCTION "{_schema()}".claim_fair(text, int, bool, bool, float8, bool, text)')
