"""initial schema: jobs, tenants, settings, tenant_schedule

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JOBS_STORAGE = {
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_analyze_scale_factor": "0.02",
    "autovacuum_vacuum_cost_delay": "0",
    "fillfactor": "90",
}


def _schema() -> str:
    return str(op.get_context().opts["version_table_schema"])


def upgrade() -> None:
    s = _schema()
    op.create_table(
        "jobs",
        sa.Column("id", sa.BigInteger, sa.Identity(always=False), nullable=False),
        sa.Column("queue", sa.Text, nullable=False, server_default=sa.text("'default'")),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("task", sa.Text, nullable=False),
        sa.Column("payload", postgresql.JSONB, nullable=False,
                  server_default=sa.text("'{}'::jsonb")),
        sa.Column("status", sa.Text, nullable=False, server_default=sa.text("'queued'")),
        sa.Column("priority", sa.SmallInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("cost", sa.Float, nullable=False, server_default=sa.text("1")),
        sa.Column("run_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
        sa.Column("attempts", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("max_attempts", sa.Integer, nullable=False, server_default=sa.text("5")),
        sa.Column("lease_seconds", sa.Integer, nullable=False, server_default=sa.text("300")),
        sa.Column("locked_until", sa.DateTime(timezone=True)),
        sa.Column("locked_by", sa.Text),
        sa.Column("last_error", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.PrimaryKeyConstraint("id", name="jobs_pkey"),
        sa.CheckConstraint("status IN ('queued', 'running', 'done', 'failed', 'cancelled')",
                           name="jobs_status_check"),
        sa.CheckConstraint("cost > 0 AND cost < 'Infinity'::float8", name="jobs_cost_check"),
        sa.CheckConstraint("max_attempts >= 1", name="jobs_max_attempts_check"),
        sa.CheckConstraint("lease_seconds >= 1", name="jobs_lease_seconds_check"),
        sa.CheckConstraint("length(tenant) BETWEEN 1 AND 200", name="jobs_tenant_check"),
        sa.CheckConstraint("length(queue) BETWEEN 1 AND 200", name="jobs_queue_check"),
        schema=s,
    )
    op.execute(sa.text(
        f'ALTER TABLE "{s}".jobs SET ('
        + ", ".join(f"{k} = {v}" for k, v in JOBS_STORAGE.items()) + ")"
    ))
    op.create_index("jobs_tenant_ready_idx", "jobs",
                    ["queue", "tenant", sa.text("priority DESC"), "run_at", "id"],
                    schema=s, postgresql_where=sa.text("status = 'queued'"))
    op.create_index("jobs_fifo_ready_idx", "jobs",
                    ["queue", sa.text("priority DESC"), "run_at", "id"],
                    schema=s, postgresql_where=sa.text("status = 'queued'"))
    op.create_index("jobs_lease_idx", "jobs", ["locked_until"], schema=s,
                    postgresql_where=sa.text("status = 'running'"))
    op.create_index("jobs_finished_idx", "jobs", ["finished_at"], schema=s,
                    postgresql_where=sa.text("status IN ('done', 'failed', 'cancelled')"))

    op.create_table(
        "tenants",
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("weight", sa.Float, nullable=False),
        sa.Column("max_running", sa.Integer, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
        sa.PrimaryKeyConstraint("tenant", name="tenants_pkey"),
        sa.CheckConstraint("weight > 0 AND weight < 'Infinity'::float8",
                           name="tenants_weight_check"),
        sa.CheckConstraint("max_running >= 0", name="tenants_max_running_check"),
        schema=s,
    )
    op.create_table(
        "settings",
        sa.Column("key", sa.Text, nullable=False),
        sa.Column("value", postgresql.JSONB, nullable=False),
        sa.PrimaryKeyConstraint("key", name="settings_pkey"),
        schema=s,
    )
    op.execute(sa.text(
        f'INSERT INTO "{s}".settings (key, value) VALUES '
        "('tenant_defaults', '{\"weight\": 1.0, \"max_running\": 10}'::jsonb) "
        "ON CONFLICT (key) DO NOTHING"
    ))
    op.create_table(
        "tenant_schedule",
        sa.Column("queue", sa.Text, nullable=False),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("weight", sa.Float, nullable=False, server_default=sa.text("1")),
        sa.Column("max_running", sa.Integer, nullable=False, server_default=sa.text("10")),
        sa.Column("running", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("vtime", sa.Float, nullable=False, server_default=sa.text("0")),
        sa.Column("active", sa.Boolean, nullable=False, server_default=sa.text("true")),
        sa.Column("wake_at", sa.DateTime(timezone=True)),
        sa.Column("claimed_total", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("last_served_at", sa.DateTime(timezone=True)),
        sa.PrimaryKeyConstraint("queue", "tenant", name="tenant_schedule_pkey"),
        sa.CheckConstraint("running >= 0", name="tenant_schedule_running_check"),
        schema=s,
    )
    op.create_index("tenant_schedule_runnable_idx", "tenant_schedule",
                    ["queue", "vtime", "tenant"], schema=s,
                    postgresql_where=sa.text("active AND running < max_running"))
    op.create_index("tenant_schedule_active_idx", "tenant_schedule", ["queue", "vtime"],
                    schema=s, postgresql_where=sa.text("active"))
    op.create_index("tenant_schedule_wake_idx", "tenant_schedule", ["wake_at"], schema=s,
                    postgresql_where=sa.text("NOT active"))


def downgrade() -> None:
    s = _schema()
    op.drop_table("tenant_schedule", schema=s)
    op.drop_table("settings", schema=s)
    op.drop_table("tenants", schema=s)
    op.drop_table("jobs", schema=s)
