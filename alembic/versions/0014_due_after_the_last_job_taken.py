"""a fair claim asks whether the tenant it stopped at has a due job after the last one it took

- engine_v8.sql: ``due_after``, which claim_fair calls for the tenant the batch cut short: it
  reads the tenant's queue from the last job taken on, where claim_fair read it again from its
  head, stepping over every job claimed since the last VACUUM of jobs.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""
from __future__ import annotations

from importlib import resources

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def _schema() -> str:
    return str(op.get_context().opts["version_table_schema"])


def upgrade() -> None:
    ddl = resources.files("fairq.sql").joinpath("ddl/engine_v8.sql").read_text(encoding="utf-8")
    op.execute(sa.text(ddl.replace("{schema}", f'"{_schema()}"'))
               .execution_options(no_parameters=True))


def downgrade() -> None:
    op.execute(f'DROP FUNCTION "{_schema()}".due_after(text, text, bigint[])')
