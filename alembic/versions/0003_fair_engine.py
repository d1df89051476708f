"""the fair engine: tenants leave the runnable set with their last due job; plans that hold

- ``queue_vtime``, ``claim_share``, ``claim_head`` and ``claim_settle``
  (fairq/sql/ddl/engine_v1.sql): the one definition of the queue's virtual time, and the parts
  of a fair claim that need their own snapshots: the wait for a held tenant, and the end of a
  claim, which retires a tenant under a lock that an enqueue's FOR KEY SHARE conflicts with,
  deciding "no due job" with a snapshot taken after that lock (docs/algorithm.md).
- ``jobs_fifo_ready_idx`` gets a predicate the per-tenant job pick does not imply
  (``cost > 0``, always true by jobs_cost_check): with statistics never taken the planner read a
  tenant's jobs through it, filtering out every other tenant's queued jobs (5,000 rows per
  tenant behind a whale). Now only ``jobs_tenant_ready_idx`` serves that pick.
- ``tenant_schedule_active_idx`` (active) becomes ``tenant_schedule_capped_idx`` (active and at
  the cap): it serves the virtual time when every active tenant is capped, and the claim's
  runnable scan (``running < max_running``) cannot use it instead of the runnable index.
- ``tenant_schedule_due_idx`` (queue, wake_at) of idle tenants: a claim wakes its queue's due
  sleepers itself.
- Weights between 0.001 and 1000 (existing values are clamped into the range first).
- Tenants marked active with no due job (the old engine left them for a later claim) are retired
  now, so the new invariant holds from the start.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""
from __future__ import annotations

from importlib import resources

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

MIN_WEIGHT, MAX_WEIGHT = 0.001, 1000.0


def _schema() -> str:
    return str(op.get_context().opts["version_table_schema"])


def engine_functions_ddl(schema: str) -> str:
    """engine_v1.sql for ``schema`` (quoted): the functions' history lives in that file."""
    text = resources.files("fairq.sql").joinpath("ddl/engine_v1.sql").read_text(encoding="utf-8")
    return text.replace("{schema}", f'"{schema}"')


def upgrade() -> None:
    s = _schema()
    q = f'"{s}"'
    op.execute(sa.text(engine_functions_ddl(s)).execution_options(no_parameters=True))

    op.create_index("jobs_fifo_ready_idx_new", "jobs",
                    ["queue", sa.text("priority DESC"), "run_at", "id"], schema=s,
                    postgresql_where=sa.text("status = 'queued' AND cost > 0"))
    op.drop_index("jobs_fifo_ready_idx", table_name="jobs", schema=s)
    op.execute(sa.text(f"ALTER INDEX {q}.jobs_fifo_ready_idx_new RENAME TO jobs_fifo_ready_idx"))

    op.drop_index("tenant_schedule_active_idx", table_name="tenant_schedule", schema=s)
    op.create_index("tenant_schedule_capped_idx", "tenant_schedule", ["queue", "vtime"], schema=s,
                    postgresql_where=sa.text("active AND running >= max_running"))
    op.create_index("tenant_schedule_due_idx", "tenant_schedule", ["queue", "wake_at"], schema=s,
                    postgresql_where=sa.text("NOT active"))

    for table in ("tenants", "tenant_schedule"):
        op.execute(sa.text(f"UPDATE {q}.{table} SET weight = least(greatest(weight, {MIN_WEIGHT}), "
                           f"{MAX_WEIGHT}) WHERE weight < {MIN_WEIGHT} OR weight > {MAX_WEIGHT}"))
    op.execute(sa.text(
        f"UPDATE {q}.settings SET value = jsonb_set(value, '{{weight}}', to_jsonb(least(greatest("
        f"(value->>'weight')::float8, {MIN_WEIGHT}), {MAX_WEIGHT}))) WHERE key = 'tenant_defaults'"))
    op.drop_constraint("tenants_weight_check", "tenants", schema=s)
    op.create_check_constraint("tenants_weight_check", "tenants",
                               "weight >= 0.001 AND weight <= 1000", schema=s)
    op.create_check_constraint("tenant_schedule_weight_check", "tenant_schedule",
                               "weight >= 0.001 AND weight <= 1000", schema=s)

    op.execute(sa.text(
        f"UPDATE {q}.tenant_schedule ts SET active = false, wake_at = ("
        f"SELECT min(j.run_at) FROM {q}.jobs j WHERE j.queue = ts.queue AND j.tenant = ts.tenant"
        f" AND j.status = 'queued') WHERE ts.active AND NOT EXISTS (SELECT FROM {q}.jobs j"
        f" WHERE j.queue = ts.queue AND j.tenant = ts.tenant AND j.status = 'queued'"
        f" AND j.run_at <= now())"))


def downgrade() -> None:
    s = _schema()
    q = f'"{s}"'
    op.drop_constraint("tenant_schedule_weight_check", "tenant_schedule", schema=s)
    op.drop_constraint("tenants_weight_check", "tenants", schema=s)
    op.create_check_constraint("tenants_weight_check", "tenants",
                               "weight > 0 AND weight < 'Infinity'::float8", schema=s)
    op.drop_index("tenant_schedule_due_idx", table_name="tenant_schedule", schema=s)
    op.drop_index("tenant_schedule_capped_idx", table_name="tenant_schedule", schema=s)
    op.create_index("tenant_schedule_active_idx", "tenant_schedule", ["queue", "vtime"], schema=s,
                    postgresql_where=sa.text("active"))
    op.create_index("jobs_fifo_ready_idx_old", "jobs",
                    ["queue", sa.text("priority DESC"), "run_at", "id"], schema=s,
                    postgresql_where=sa.text("status = 'queued'"))
    op.drop_index("jobs_fifo_ready_idx", table_name="jobs", schema=s)
    op.execute(sa.text(f"ALTER INDEX {q}.jobs_fifo_ready_idx_old RENAME TO jobs_fifo_ready_idx"))
    op.execute(sa.text(f"DROP FUNCTION {q}.claim_settle(text, bool, float8, float8, text, tid[], "
                       "text[], int[], float8[], text[], tid[], text[])"))
    op.execute(sa.text(f"DROP FUNCTION {q}.claim_head(text, int)"))
    op.execute(sa.text(f"DROP FUNCTION {q}.claim_share(text, float8, int, bool, float8[])"))
    op.execute(sa.text(f"DROP FUNCTION {q}.queue_vtime(text)"))
