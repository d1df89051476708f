"""rate limits: a token bucket per (queue, tenant), enforced by the claim; tenant groups

- ``tenants`` and ``tenant_schedule`` get ``rate`` (jobs per second, NULL = unlimited) and
  ``burst`` (the bucket's size); the schedule row also holds the bucket (``tokens`` as of
  ``refilled_at``; NULL = full).
- engine_v2.sql: ``tenant_tokens``, ``claim_room``, ``tenant_dry`` and ``token_due``, and new
  ``claim_head`` / ``claim_settle``: a claim takes at most a tenant's whole tokens, and a tenant
  left without one leaves the runnable set until its next token is due (docs/algorithm.md).
- Tenant groups: ``tenant_groups`` (a group's weight), ``tenant_group`` on ``tenants`` and
  ``tenant_schedule``, and ``group_schedule`` (queue, group, factor): a tenant's weight in a
  claim is its weight times its group's factor, group weight / the weights of the group's
  active tenants (``eff_weight``, refreshed by ``refresh_groups`` at most once a second).

Revision ID: 0007
Revises: 0003
Create Date: 2026-11-30
"""
from __future__ import annotations

from importlib import resources

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0004"
branch_labels = None
depends_on = None

RATE_CHECK = "rate IS NULL OR (rate >= 0.001 AND rate <= 1000000 AND burst >= 1 AND burst <= 1000000)"


def _schema() -> str:
    return str(op.get_context().opts["version_table_schema"])


def engine_v2_ddl(schema: str) -> str:
    """engine_v2.sql for ``schema`` (quoted)."""
    text = resources.files("fairq.sql").joinpath("ddl/engine_v2.sql").read_text(encoding="utf-8")
    return text.replace("{schema}", f'"{schema}"')


def upgrade() -> None:
    s = _schema()
    for table in ("tenants", "tenant_schedule"):
        op.add_column(table, sa.Column("rate", sa.Float()), schema=s)
        op.add_column(table, sa.Column("burst", sa.Integer()), schema=s)
        op.create_check_constraint(f"{table}_rate_check", table, RATE_CHECK, schema=s)
    op.add_column("tenant_schedule", sa.Column("tokens", sa.Float()), schema=s)
    op.add_column("tenant_schedule", sa.Column("refilled_at", sa.DateTime(timezone=True)), schema=s)
    op.create_table(
        "tenant_groups",
        sa.Column("tenant_group", sa.Text(), nullable=False),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
        sa.PrimaryKeyConstraint("tenant_group", name="tenant_groups_pkey"),
        sa.CheckConstraint("weight >= 0.001 AND weight <= 1000", name="tenant_groups_weight_check"),
        schema=s)
    op.create_table(
        "group_schedule",
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("tenant_group", sa.Text(), nullable=False),
        sa.Column("factor", sa.Float(), nullable=False),
        sa.Column("refreshed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("queue", "tenant_group", name="group_schedule_pkey"),
        schema=s)
    for table in ("tenants", "tenant_schedule"):
        op.add_column(table, sa.Column("tenant_group", sa.Text()), schema=s)
    op.execute(sa.text(engine_v2_ddl(s)).execution_options(no_parameters=True))


def downgrade() -> None:
    s = _schema()
    q = f'"{s}"'
    # The functions that read the row type go first; then engine_v1's claim_head and
    # claim_settle come back.
    for fn in ("claim_terms", "token_due", "tenant_dry", "claim_room", "tenant_tokens",
               "eff_weight"):
        op.execute(sa.text(f"DROP FUNCTION {q}.{fn}({q}.tenant_schedule) CASCADE"))
    op.execute(sa.text(f"DROP FUNCTION {q}.refresh_groups(text)"))
    op.execute(sa.text(f"DROP FUNCTION {q}.groups_due(text)"))
    v1 = resources.files("fairq.sql").joinpath("ddl/engine_v1.sql").read_text(encoding="utf-8")
    for name in ("claim_share", "claim_head", "claim_settle"):
        start = v1.index(f"CREATE FUNCTION {{schema}}.{name}(")
        end = v1.index("\n$$;", start) + 4
        body = v1[start:end].replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
        op.execute(sa.text(body.replace("{schema}", q)).execution_options(no_parameters=True))
    for table in ("tenants", "tenant_schedule"):
        op.drop_column(table, "tenant_group", schema=s)
    op.drop_table("group_schedule", schema=s)
    op.drop_table("tenant_groups", schema=s)
    op.drop_column("tenant_schedule", "refilled_at", schema=s)
    op.drop_column("tenant_schedule", "tokens", schema=s)
    for table in ("tenants", "tenant_schedule"):
        op.drop_constraint(f"{table}_rate_check", table, schema=s)
        op.drop_column(table, "burst", schema=s)
        op.drop_column(table, "rate", schema=s)
