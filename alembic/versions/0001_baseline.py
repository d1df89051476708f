"""baseline: fairq's tables, indexes, row-level security and SQL functions

Revision ID: 0001
Revises:
Create Date: 2026-12-05

Every migration is self-contained: it carries the SQL it installs and the SQL its downgrade
restores (as Oban's versioned migration modules and River's numbered up/down files do). This one
writes its tables out here and reads its functions from the folder beside it,
``0001_baseline/``; a later migration that replaces a function brings the new text in a folder
of its own, and the text its downgrade puts back, and never reads or edits an earlier
migration's files, so no later edit changes what an old migration does. Nothing here imports
fairq: ``fairq.schema`` describes today's schema and changes with it.
"""
from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

FOLDER = "0001_baseline"
# In the order they must be created: a sql function's body is checked against the functions it
# calls when it is created; plpgsql bodies are not.
FUNCTION_FILES = ("vtime.sql", "rate_limits.sql", "weights.sql", "settle.sql", "claim.sql",
                  "enqueue.sql", "slots.sql", "decay.sql", "reasons.sql")
# Every function those files create, for the downgrade (identity arguments; {s} the schema).
FUNCTIONS = (
    "enqueue(text, text, jsonb, text, timestamptz, int, float8, int, int, text)",
    "enqueue_many(text[], text[], jsonb[], text[], timestamptz[], float8[], int[], float8[], "
    "int[], int[], text[])",
    "claim_fair(text, int, bool, bool, bool, float8, bool, text)",
    "wait_and_pick(text, int, bool, bool, bool)",
    "return_slots(text[], text[], int[], bool[], timestamptz[], float8[], int[], float8[])",
    "returns_lock(text, text)",
    "fold_returns(text[], text[])",
    "run_average(float8, int, float8)",
    "fold_capped(text)",
    "fold_stale_returns(float8)",
    "return_budgets(float8)",
    "give_ahead(text, text, tid, text, int, int, bool)",
    "settle_capped(text[], text[])",
    "tenant_running({s}.tenant_schedule)",
    "decay_usage(text, float8)",
    "claim_terms({s}.tenant_schedule)",
    "claim_settle(text, bool, float8, float8, text, tid[], text[], int[], float8[], text[], "
    "tid[], text[])",
    "groups_due(text)",
    "refresh_groups(text)",
    "eff_weight({s}.tenant_schedule)",
    "effective_weight(float8, float8)",
    "throttled_total({s}.tenant_schedule)",
    "throttled_open({s}.tenant_schedule)",
    "token_at({s}.tenant_schedule)",
    "token_due({s}.tenant_schedule)",
    "tenant_dry({s}.tenant_schedule)",
    "claim_room({s}.tenant_schedule)",
    "tenant_tokens({s}.tenant_schedule)",
    "queue_vtime(text)",
    "wait_reason(int, int, int, int, bool, timestamptz, timestamptz, int, bool)",
)
TABLES = ("workers", "group_schedule", "tenant_groups", "periodic", "slot_returns",
          "claim_budgets", "tenant_schedule", "settings", "tenants", "jobs")

# The jobs table churns: vacuum it after 1% of its rows died instead of PostgreSQL's 20%.
JOBS_STORAGE = {
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_analyze_scale_factor": "0.02",
    "autovacuum_vacuum_cost_delay": "0",
    "fillfactor": "90",
}
WEIGHT_CHECK = "weight >= 0.001 AND weight <= 1000"
RATE_CHECK = ("rate IS NULL OR (rate >= 0.001 AND rate <= 1000000 AND burst >= 1 "
              "AND burst <= 1000000)")
# settings: every role reads it; a role other than the owner writes only the maintenance
# stamps, never the tenant defaults.
STAMP = "key LIKE 'maintenance:%'"
# Times every client can decode.
RUN_AT_CHECK = ("run_at >= '1970-01-01 00:00:00+00'::timestamptz "
                "AND run_at < '9999-01-01 00:00:00+00'::timestamptz")


def _schema() -> str:
    return str(op.get_context().opts["version_table_schema"])


def _folder() -> Traversable:
    """This migration's SQL: package data of ``fairq.migrations.versions`` in an installed
    fairq; in a checkout (where ``alembic/`` is not importable under that name), beside this
    file."""
    try:
        return resources.files("fairq.migrations.versions").joinpath(FOLDER)
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent / FOLDER


def _execute(ddl: str) -> None:
    op.execute(sa.text(ddl).execution_options(no_parameters=True))


def _now() -> sa.TextClause:
    return sa.text("now()")


def upgrade() -> None:
    s = _schema()
    q = f'"{s}"'
    ts = sa.DateTime(timezone=True)
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
        sa.Column("run_at", ts, nullable=False, server_default=_now()),
        sa.Column("attempts", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("max_attempts", sa.Integer, nullable=False, server_default=sa.text("5")),
        sa.Column("lease_seconds", sa.Integer, nullable=False, server_default=sa.text("300")),
        sa.Column("locked_until", ts),
        sa.Column("locked_by", sa.Text),
        sa.Column("last_error", sa.Text),
        sa.Column("created_at", ts, nullable=False, server_default=_now()),
        sa.Column("started_at", ts),
        sa.Column("finished_at", ts),
        sa.Column("result", postgresql.JSONB),
        sa.Column("key", sa.Text),
        sa.Column("charged_s", sa.Float),
        sa.PrimaryKeyConstraint("id", name="jobs_pkey"),
        sa.CheckConstraint("status IN ('queued', 'running', 'done', 'failed', 'cancelled')",
                           name="jobs_status_check"),
        sa.CheckConstraint("cost > 0 AND cost < 'Infinity'::float8", name="jobs_cost_check"),
        sa.CheckConstraint("max_attempts >= 1", name="jobs_max_attempts_check"),
        sa.CheckConstraint("lease_seconds >= 1", name="jobs_lease_seconds_check"),
        sa.CheckConstraint("length(tenant) BETWEEN 1 AND 200", name="jobs_tenant_check"),
        sa.CheckConstraint("length(queue) BETWEEN 1 AND 200", name="jobs_queue_check"),
        sa.CheckConstraint("length(key) BETWEEN 1 AND 200", name="jobs_key_check"),
        sa.CheckConstraint(RUN_AT_CHECK, name="jobs_run_at_check"),
        schema=s,
    )
    _execute(f"ALTER TABLE {q}.jobs SET ("
             + ", ".join(f"{k} = {v}" for k, v in JOBS_STORAGE.items()) + ")")
    op.create_index("jobs_tenant_ready_idx", "jobs",
                    ["queue", "tenant", sa.text("priority DESC"), "run_at", "id"], schema=s,
                    postgresql_where=sa.text("status = 'queued'"),
                    postgresql_with={"deduplicate_items": "off"})
    op.create_index("jobs_fifo_ready_idx", "jobs",
                    ["queue", sa.text("priority DESC"), "run_at", "id"], schema=s,
                    postgresql_where=sa.text("status = 'queued' AND cost > 0"),
                    postgresql_with={"deduplicate_items": "off"})
    op.create_index("jobs_lease_idx", "jobs", ["locked_until"], schema=s,
                    postgresql_where=sa.text("locked_until IS NOT NULL"))
    op.create_index("jobs_key_idx", "jobs", ["task", "tenant", "key"], unique=True, schema=s,
                    postgresql_where=sa.text(
                        "key IS NOT NULL AND status IN ('queued', 'running')"))
    op.create_index("jobs_finished_idx", "jobs", ["finished_at"], schema=s,
                    postgresql_where=sa.text("status IN ('done', 'failed', 'cancelled')"))

    op.create_table(
        "tenants",
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("weight", sa.Float, nullable=False),
        sa.Column("max_running", sa.Integer, nullable=False),
        sa.Column("updated_at", ts, nullable=False, server_default=_now()),
        sa.Column("rate", sa.Float),
        sa.Column("burst", sa.Integer),
        sa.Column("tenant_group", sa.Text),
        sa.PrimaryKeyConstraint("tenant", name="tenants_pkey"),
        sa.CheckConstraint(WEIGHT_CHECK, name="tenants_weight_check"),
        sa.CheckConstraint("max_running >= 0", name="tenants_max_running_check"),
        sa.CheckConstraint(RATE_CHECK, name="tenants_rate_check"),
        schema=s,
    )

    op.create_table(
        "settings",
        sa.Column("key", sa.Text, nullable=False),
        sa.Column("value", postgresql.JSONB, nullable=False),
        sa.PrimaryKeyConstraint("key", name="settings_pkey"),
        schema=s,
    )
    _execute(f"INSERT INTO {q}.settings (key, value) VALUES "
             "('tenant_defaults', '{\"weight\": 1.0, \"max_running\": 10}'::jsonb) "
             "ON CONFLICT (key) DO NOTHING")
    _execute(f"ALTER TABLE {q}.settings ENABLE ROW LEVEL SECURITY;\n"
             f"CREATE POLICY settings_read ON {q}.settings FOR SELECT USING (true);\n"
             f"CREATE POLICY settings_stamp_insert ON {q}.settings FOR INSERT "
             f"WITH CHECK ({STAMP});\n"
             f"CREATE POLICY settings_stamp_update ON {q}.settings FOR UPDATE "
             f"USING ({STAMP}) WITH CHECK ({STAMP})")

    op.create_table(
        "tenant_schedule",
        sa.Column("queue", sa.Text, nullable=False),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("weight", sa.Float, nullable=False, server_default=sa.text("1")),
        sa.Column("max_running", sa.Integer, nullable=False, server_default=sa.text("10")),
        sa.Column("running", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("vtime", sa.Float, nullable=False, server_default=sa.text("0")),
        sa.Column("active", sa.Boolean, nullable=False, server_default=sa.text("true")),
        sa.Column("wake_at", ts),
        sa.Column("claimed_total", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("last_served_at", ts),
        sa.Column("rate", sa.Float),
        sa.Column("burst", sa.Integer),
        sa.Column("tokens", sa.Float),
        sa.Column("refilled_at", ts),
        sa.Column("tenant_group", sa.Text),
        sa.Column("throttled_seconds", sa.Float, nullable=False, server_default=sa.text("0")),
        sa.Column("throttled_since", ts),
        sa.Column("avg_run_s", sa.Float),
        sa.PrimaryKeyConstraint("queue", "tenant", name="tenant_schedule_pkey"),
        sa.CheckConstraint("running >= 0", name="tenant_schedule_running_check"),
        sa.CheckConstraint(WEIGHT_CHECK, name="tenant_schedule_weight_check"),
        sa.CheckConstraint(RATE_CHECK, name="tenant_schedule_rate_check"),
        schema=s,
    )
    op.create_index("tenant_schedule_runnable_idx", "tenant_schedule",
                    ["queue", "vtime", "tenant"], schema=s,
                    postgresql_where=sa.text("active AND running < max_running"))
    op.create_index("tenant_schedule_capped_idx", "tenant_schedule", ["queue", "vtime"],
                    schema=s, postgresql_where=sa.text("active AND running >= max_running"))
    op.create_index("tenant_schedule_wake_idx", "tenant_schedule", ["wake_at"], schema=s,
                    postgresql_where=sa.text("NOT active AND wake_at IS NOT NULL"))
    op.create_index("tenant_schedule_due_idx", "tenant_schedule", ["queue", "wake_at"],
                    schema=s, postgresql_where=sa.text("NOT active AND wake_at IS NOT NULL"))

    # Slots given back while their tenant's row was held (by a claim, mostly): folded into
    # tenant_schedule.running by whoever holds the row next (slots.sql).
    op.create_table(
        "slot_returns",
        sa.Column("queue", sa.Text, nullable=False),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("n", sa.Integer, nullable=False),
        sa.Column("corr", sa.Float, nullable=False, server_default=sa.text("0")),
        sa.Column("runs", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("run_sum", sa.Float, nullable=False, server_default=sa.text("0")),
        sa.Column("capped", sa.Boolean, nullable=False, server_default=sa.text("false")),
        sa.Column("at", ts, nullable=False, server_default=_now()),
        sa.CheckConstraint("n >= 0", name="slot_returns_n_check"),
        schema=s,
    )
    op.create_index("slot_returns_tenant_idx", "slot_returns", ["queue", "tenant"], schema=s)
    op.create_index("slot_returns_capped_idx", "slot_returns", ["queue"], schema=s,
                    postgresql_where=sa.text("capped"))

    # Slots a claim that waited for a busy tenant's row counted ahead for its worker (running
    # and virtual time charged in the row): the worker's next claims that find the row held
    # start that many jobs without it (claim.sql, decision 015).
    op.create_table(
        "claim_budgets",
        sa.Column("queue", sa.Text, nullable=False),
        sa.Column("worker", sa.Text, nullable=False),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("slots", sa.Integer, nullable=False),
        sa.Column("at", ts, nullable=False, server_default=_now()),
        sa.PrimaryKeyConstraint("queue", "worker", "tenant", name="claim_budgets_pkey"),
        sa.CheckConstraint("slots >= 0", name="claim_budgets_slots_check"),
        schema=s,
    )
    op.create_index("claim_budgets_tenant_idx", "claim_budgets", ["queue", "tenant"], schema=s)

    op.create_table(
        "periodic",
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("task", sa.Text, nullable=False),
        sa.Column("cron", sa.Text, nullable=False),
        sa.Column("last_tick", ts, nullable=False),
        sa.Column("last_job_id", sa.BigInteger),
        sa.Column("updated_at", ts, nullable=False, server_default=_now()),
        sa.PrimaryKeyConstraint("name", "tenant", name="periodic_pkey"),
        schema=s,
    )
    op.create_table(
        "tenant_groups",
        sa.Column("tenant_group", sa.Text, nullable=False),
        sa.Column("weight", sa.Float, nullable=False),
        sa.Column("updated_at", ts, nullable=False, server_default=_now()),
        sa.PrimaryKeyConstraint("tenant_group", name="tenant_groups_pkey"),
        sa.CheckConstraint(WEIGHT_CHECK, name="tenant_groups_weight_check"),
        schema=s,
    )
    op.create_table(
        "group_schedule",
        sa.Column("queue", sa.Text, nullable=False),
        sa.Column("tenant_group", sa.Text, nullable=False),
        sa.Column("factor", sa.Float, nullable=False),
        sa.Column("refreshed_at", ts, nullable=False),
        sa.PrimaryKeyConstraint("queue", "tenant_group", name="group_schedule_pkey"),
        sa.CheckConstraint("factor > 0 AND factor <= 1000000", name="group_schedule_factor_check"),
        sa.CheckConstraint("refreshed_at < 'infinity'::timestamptz",
                           name="group_schedule_refreshed_at_check"),
        schema=s,
    )
    op.create_table(
        "workers",
        sa.Column("worker_id", sa.Text, nullable=False),
        sa.Column("queues", postgresql.ARRAY(sa.Text), nullable=False),
        sa.Column("policy", sa.Text, nullable=False),
        sa.Column("beat_seconds", sa.Float, nullable=False),
        sa.Column("started_at", ts, nullable=False, server_default=_now()),
        sa.Column("seen_at", ts, nullable=False, server_default=_now()),
        sa.PrimaryKeyConstraint("worker_id", name="workers_pkey"),
        sa.CheckConstraint("beat_seconds > 0", name="workers_beat_seconds_check"),
        schema=s,
    )

    folder = _folder()
    for name in FUNCTION_FILES:
        text = folder.joinpath(name).read_text(encoding="utf-8")
        _execute(text.replace("{schema}", q).replace("{channel}", f"'fairq_{s}'"))


def downgrade() -> None:
    s = _schema()
    q = f'"{s}"'
    for signature in FUNCTIONS:
        _execute(f"DROP FUNCTION {q}.{signature.format(s=q)}")
    for table in TABLES:
        op.drop_table(table, schema=s)
