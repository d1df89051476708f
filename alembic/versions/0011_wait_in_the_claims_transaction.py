"""the wait picks its jobs before it waits, and keeps no subtransaction lock

- engine_v6.sql: ``claim_wait`` locks the jobs it will take in the claim's own transaction,
  before it waits for their tenant's row, and takes that row with a no-op UPDATE in its
  subtransaction instead of a lock. engine_v5.sql's version locked both in a subtransaction the
  claim then updated them from, which gave the tenant's row and every job taken a MultiXact.
  Same signature and result: workers of the earlier release call it unchanged.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""
from __future__ import annotations

from importlib import resources

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def _schema() -> str:
    return str(op.get_context().opts["version_table_schema"])


def _ddl(version: int) -> str:
    return resources.files("fairq.sql").joinpath(f"ddl/engine_v{version}.sql").read_text(
        encoding="utf-8")


def upgrade() -> None:
    op.execute(sa.text(_ddl(6).replace("{schema}", f'"{_schema()}"'))
               .execution_options(no_parameters=True))


def downgrade() -> None:
    v5 = _ddl(5)  # its claim_wait
    start = v5.index("CREATE FUNCTION {schema}.claim_wait(")
    end = v5.index("\n$$;", start) + 4
    op.execute(sa.text(v5[start:end].replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")
                       .replace("{schema}", f'"{_schema()}"'))
               .execution_options(no_parameters=True))
