"""the wait reads its tenant's queue head once, and says whether a due job is left

- engine_v7.sql: ``wait_and_pick``, which the fair claim calls instead of ``claim_wait``: it
  picks one job more than the claim may take (left locked, not taken) rather than asking first
  whether the tenant has a due job and afterwards whether one is left; the claim statement's
  own question, asked in its snapshot from before the wait, left a tenant whose last jobs a
  waited claim took runnable and empty. ``claim_wait`` stays for workers of the earlier release.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""
from __future__ import annotations

from importlib import resources

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def _schema() -> str:
    return str(op.get_context().opts["version_table_schema"])


def upgrade() -> None:
    ddl = resources.files("fairq.sql").joinpath("ddl/engine_v7.sql").read_text(encoding="utf-8")
    op.execute(sa.text(ddl.replace("{schema}", f'"{_schema()}"'))
               .execution_options(no_parameters=True))


def downgrade() -> None:
    op.execute(f'DROP FUNCTION "{_schema()}".wait_and_pick(text, int, bool, bool)')
