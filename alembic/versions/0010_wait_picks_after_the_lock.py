"""the wait picks its jobs after it holds the tenant's row

- engine_v5.sql: ``claim_wait``, which a fair claim calls when every tenant with a due job is
  held by other claims. It waits for the first such tenant's row, as ``claim_head`` did, and
  picks the tenant's jobs itself, in a snapshot taken after the wait, instead of leaving the
  pick to the claim statement, whose older snapshot made it lock and recheck every job the
  claim it waited for had taken. ``claim_head`` stays for workers of the earlier release.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""
from __future__ import annotations

from importlib import resources

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def _schema() -> str:
    return str(op.get_context().opts["version_table_schema"])


def _ddl(version: int) -> str:
    return resources.files("fairq.sql").joinpath(f"ddl/engine_v{version}.sql").read_text(
        encoding="utf-8")


def upgrade() -> None:
    op.execute(sa.text(_ddl(5).replace("{schema}", f'"{_schema()}"'))
               .execution_options(no_parameters=True))


def downgrade() -> None:
    s = _schema()
    v4 = _ddl(4)  # its claim_settle
    start = v4.index("CREATE OR REPLACE FUNCTION {schema}.claim_settle(")
    end = v4.index("\n$$;", start) + 4
    op.execute(sa.text(v4[start:end].replace("{schema}", f'"{s}"'))
               .execution_options(no_parameters=True))
    op.execute(sa.text(f'DROP FUNCTION "{s}".claim_wait(text, int)')
               .execution_options(no_parameters=True))
