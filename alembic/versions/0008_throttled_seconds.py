"""time spent throttled: a per (queue, tenant) counter of the seconds a rate-limit kept a due job

- ``tenant_schedule.throttled_seconds`` (float8, default 0): seconds the tenant had a due job and
  no whole token, credited when the interval ends; ``throttled_since``: the start of the open
  interval (NULL: none). Adding a column with a constant default rewrites nothing.
- engine_v3.sql: ``token_at``, ``throttled_open`` and ``throttled_total``; a new
  ``claim_settle`` that opens and credits the intervals (docs/algorithm.md, "Time spent
  throttled") and bounds the tenants it takes as walked past; a new ``claim_head`` that returns
  a tenant only if it still has a due job once its row is locked.

Revision ID: 0008
Revises: 0005
Create Date: 2026-11-30
"""
from __future__ import annotations

from importlib import resources

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0005"
branch_labels = None
depends_on = None


def _schema() -> str:
    return str(op.get_context().opts["version_table_schema"])


def _ddl(version: int) -> str:
    return resources.files("fairq.sql").joinpath(f"ddl/engine_v{version}.sql").read_text(
        encoding="utf-8")


def upgrade() -> None:
    s = _schema()
    op.add_column("tenant_schedule", sa.Column("throttled_seconds", sa.Float(), nullable=False,
                                               server_default=sa.text("0")), schema=s)
    op.add_column("tenant_schedule",
                  sa.Column("throttled_since", sa.DateTime(timezone=True)), schema=s)
    op.execute(sa.text(_ddl(3).replace("{schema}", f'"{s}"'))
               .execution_options(no_parameters=True))


def downgrade() -> None:
    s = _schema()
    q = f'"{s}"'
    for fn in ("throttled_total", "throttled_open", "token_at"):
        op.execute(sa.text(f"DROP FUNCTION {q}.{fn}({q}.tenant_schedule)"))
    v2 = _ddl(2)
    for fn in ("claim_settle", "claim_head"):  # their engine_v2.sql versions
        start = v2.index(f"CREATE OR REPLACE FUNCTION {{schema}}.{fn}(")
        end = v2.index("\n$$;", start) + 4
        op.execute(sa.text(v2[start:end].replace("{schema}", q))
                   .execution_options(no_parameters=True))
    op.drop_column("tenant_schedule", "throttled_since", schema=s)
    op.drop_column("tenant_schedule", "throttled_seconds", schema=s)
