"""the SQL enqueue locks its chunk's tenants by key, in an order sorted from the chunk

- enqueue_v2.sql: ``enqueue_many`` sorts the chunk's few tenants and locks each
  tenant_schedule row by its key, instead of joining tenant_schedule and ordering the join,
  which with sorts off in the session (fairq's sessions plan so: fairq/store/pg.py) read every
  tenant by primary key. Same signature, arguments and result; ``enqueue`` and the grants are
  unchanged.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from fairq.schema import enqueue_functions_ddl

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def _schema() -> str:
    return str(op.get_context().opts["version_table_schema"])


def upgrade() -> None:
    op.execute(sa.text(enqueue_functions_ddl(_schema(), 2)).execution_options(no_parameters=True))


def downgrade() -> None:
    s = _schema()
    v1 = enqueue_functions_ddl(s, 1)  # its enqueue_many
    start = v1.index(f'CREATE FUNCTION "{s}".enqueue_many(')
    end = v1.index("\n$$;", start) + 4
    op.execute(sa.text(v1[start:end].replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"))
               .execution_options(no_parameters=True))
