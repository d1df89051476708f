"""the wait reads its tenant's queue head once, and asks after the wait whether a due job is left

- engine_v7.sql: ``wait_and_pick``, which the fair claim calls instead of ``claim_wait``: it
  finds the tenant and picks its jobs in one read (claim_wait read the queue's head twice), and
  once it holds the row it asks, in a fresh snapshot, whether the tenant has a due job after the
  last one it took. The claim statement asked that in its own snapshot, older than the wait,
  which left a tenant whose last jobs a waited claim took runnable and empty. The row is locked
  in the subtransaction (claim_wait wrote it with a no-op UPDATE). ``claim_wait`` stays for
  workers of the earlier release.

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
