"""the wait locks its tenant's row in the claim's own transaction, without a subtransaction

- engine_v9.sql: ``wait_and_pick`` keeps the first row it waits for, with or without room,
  and locks any later tenant SKIP LOCKED. engine_v7.sql's version locked the row in a
  subtransaction, to give back a tenant left without room, which cost every waiting claim a
  subtransaction and the tenant's row a MultiXact. Same signature and result: workers of the
  earlier release call it unchanged.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from fairq.schema import engine_functions_ddl

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def _schema() -> str:
    return str(op.get_context().opts["version_table_schema"])


def upgrade() -> None:
    op.execute(sa.text(engine_functions_ddl(_schema(), 9)).execution_options(no_parameters=True))


def downgrade() -> None:
    s = _schema()
    v7 = engine_functions_ddl(s, 7)  # its wait_and_pick
    start = v7.index(f'CREATE FUNCTION "{s}".wait_and_pick(')
    end = v7.index("\n$$;", start) + 4
    op.execute(sa.text(v7[start:end].replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"))
               .execution_options(no_parameters=True))
