"""a fair claim passes the last job it took from the tenant it stopped at, not all of them

- engine_v11.sql: ``due_after_job``, which claim_fair calls for the tenant the batch cut short
  with the last job it took from it (its pick numbers its jobs): one primary-key lookup for
  that job's key, where ``due_after`` (engine_v8.sql) looked up every job the claim took from
  the tenant to find the last. ``due_after`` stays for workers of the earlier release.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-03
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from fairq.schema import engine_functions_ddl

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def _schema() -> str:
    return str(op.get_context().opts["version_table_schema"])


def upgrade() -> None:
    op.execute(sa.text(engine_functions_ddl(_schema(), 11)).execution_options(no_parameters=True))


def downgrade() -> None:
    op.execute(f'DROP FUNCTION "{_schema()}".due_after_job(text, text, bigint)')
