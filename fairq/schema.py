"""fairq's tables as SQLAlchemy Core metadata: the source of truth that ``alembic/`` migrates to.

Everything lives in one PostgreSQL schema (default ``fairq``) so that one database can host several
independent queues and fairq's Alembic history sits beside the application's own.
"""

from __future__ import annotations

from importlib.resources.abc import Traversable
from pathlib import Path

from sqlalchemy import (
    DDL,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    Identity,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    Text,
    event,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from fairq.names import DEFAULT_SCHEMA, validate_schema_name

STATUSES = ("queued", "running", "done", "failed", "cancelled")
FINISHED_STATUSES = ("done", "failed", "cancelled")

# Per-table autovacuum settings for the jobs table: a queue table churns, so vacuum it
# after 1% of its rows died instead of PostgreSQL's default 20%.
JOBS_STORAGE = {
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_analyze_scale_factor": "0.02",
    "autovacuum_vacuum_cost_delay": "0",
    "fillfactor": "90",
}


# The ready indexes end in the job's id, so no two of their entries are equal and deduplication
# never merges any: without it, an enqueue that fills a leaf page splits it without first
# passing over every entry (5% of a bulk enqueue's time).
READY_INDEX_STORAGE = {"deduplicate_items": "off"}


# Weights in [0.001, 1000] (fairq.validation): virtual time advances by cost / weight per job.
WEIGHT_CHECK = "weight >= 0.001 AND weight <= 1000"


# Where today's definition of each SQL function lives: files of the migrations that install them
# (alembic/versions/, packaged as fairq.migrations.versions), in the order they are created (a
# sql function's body is checked against the functions it calls when it is created). A later
# migration that replaces a function carries the new text in a folder of its own: point this
# list at that file.
FUNCTION_FILES = (
    "0001_baseline/vtime.sql",        # queue_vtime
    "0001_baseline/rate_limits.sql",  # token bucket, time spent throttled
    "0001_baseline/weights.sql",      # effective_weight, group factors
    "0001_baseline/settle.sql",       # claim_settle
    "0001_baseline/claim.sql",        # claim_fair, wait_and_pick, claim_terms
    "0001_baseline/enqueue.sql",      # enqueue, enqueue_many and their grants
    "0001_baseline/slots.sql",        # return_slots, the slot returns' folds
    "0001_baseline/decay.sql",        # decay_usage
    "0001_baseline/reasons.sql",      # wait_reason
)


def _versions_dir() -> Traversable:
    """The migrations' versions folder: package data of ``fairq.migrations.versions`` in an
    installed fairq, ``alembic/versions`` in a checkout (not importable under that name)."""
    from importlib import resources

    try:
        return resources.files("fairq.migrations.versions")
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent / "alembic" / "versions"


def functions_ddl(schema: str) -> list[str]:
    """The SQL creating fairq's functions in ``schema``, one text per file of FUNCTION_FILES:
    ``{schema}`` is the quoted schema name, ``{channel}`` the schema's NOTIFY channel
    (``fairq.store.listen.channel_for``) as a literal."""
    name = validate_schema_name(schema)
    base = _versions_dir()
    texts = []
    for path in FUNCTION_FILES:
        folder, file = path.split("/")
        text = base.joinpath(folder).joinpath(file).read_text(encoding="utf-8")
        texts.append(text.replace("{schema}", f'"{name}"').replace("{channel}", f"'fairq_{name}'"))
    return texts


def settings_policy_ddl(schema: str) -> str:
    """Row-level security on ``settings``: every role may read it, but a role other than the
    owner may write only the maintenance stamps (``maintenance:*`` keys), never the tenant
    defaults (weights and caps). The owner (``fairq tenants``) is not subject to it."""
    s = f'"{validate_schema_name(schema)}"'
    stamp = "key LIKE 'maintenance:%'"
    return (f"ALTER TABLE {s}.settings ENABLE ROW LEVEL SECURITY;\n"
            f"CREATE POLICY settings_read ON {s}.settings FOR SELECT USING (true);\n"
            f"CREATE POLICY settings_stamp_insert ON {s}.settings FOR INSERT "
            f"WITH CHECK ({stamp});\n"
            f"CREATE POLICY settings_stamp_update ON {s}.settings FOR UPDATE "
            f"USING ({stamp}) WITH CHECK ({stamp})")


# Run times every client can decode (fairq.validation and the SQL enqueue refuse the rest).
RUN_AT_CHECK = ("run_at >= '1970-01-01 00:00:00+00'::timestamptz "
                "AND run_at < '9999-01-01 00:00:00+00'::timestamptz")

# Rate limits: jobs per second with a bucket of `burst` (fairq.validation).
RATE_CHECK = ("rate IS NULL OR (rate >= 0.001 AND rate <= 1000000 AND burst >= 1 "
              "AND burst <= 1000000)")



def jobs_storage_ddl(schema: str) -> str:
    """``ALTER TABLE`` setting the jobs table's autovacuum and fill-factor parameters."""
    params = ", ".join(f"{k} = {v}" for k, v in JOBS_STORAGE.items())
    return f'ALTER TABLE "{validate_schema_name(schema)}".jobs SET ({params})'


def build_metadata(schema: str = DEFAULT_SCHEMA) -> MetaData:
    """Build the metadata for ``schema``; a fresh object each call so schemas never mix."""
    schema = validate_schema_name(schema)
    md = MetaData(schema=schema)

    jobs = Table(
        "jobs",
        md,
        Column("id", BigInteger, Identity(always=False), nullable=False),
        Column("queue", Text, nullable=False, server_default=text("'default'")),
        Column("tenant", Text, nullable=False),
        Column("task", Text, nullable=False),
        Column("payload", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
        Column("status", Text, nullable=False, server_default=text("'queued'")),
        Column("priority", SmallInteger, nullable=False, server_default=text("0")),
        Column("cost", Float, nullable=False, server_default=text("1")),
        Column("run_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
        Column("attempts", Integer, nullable=False, server_default=text("0")),
        Column("max_attempts", Integer, nullable=False, server_default=text("5")),
        Column("lease_seconds", Integer, nullable=False, server_default=text("300")),
        Column("locked_until", DateTime(timezone=True)),
        Column("locked_by", Text),
        Column("last_error", Text),
        Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
        # When the job was last claimed; wait time = started_at - run_at on the database clock.
        Column("started_at", DateTime(timezone=True)),
        Column("finished_at", DateTime(timezone=True)),
        # A done job's return value (fairq.results): NULL when it returned None or too much.
        Column("result", JSONB),
        # An idempotency key: unique per (task, tenant) among queued and running jobs
        # (jobs_key_idx): one tenant's key never finds another tenant's job.
        Column("key", Text),
        # What a claim under policy time charged the job, in expected seconds (NULL under the
        # other policies): its finish corrects its tenant's virtual time by the time it ran
        # minus this.
        Column("charged_s", Float),
        PrimaryKeyConstraint("id", name="jobs_pkey"),
        CheckConstraint(
            "status IN ('queued', 'running', 'done', 'failed', 'cancelled')",
            name="jobs_status_check",
        ),
        CheckConstraint("cost > 0 AND cost < 'Infinity'::float8", name="jobs_cost_check"),
        CheckConstraint("max_attempts >= 1", name="jobs_max_attempts_check"),
        CheckConstraint("lease_seconds >= 1", name="jobs_lease_seconds_check"),
        CheckConstraint("length(tenant) BETWEEN 1 AND 200", name="jobs_tenant_check"),
        CheckConstraint("length(queue) BETWEEN 1 AND 200", name="jobs_queue_check"),
        CheckConstraint("length(key) BETWEEN 1 AND 200", name="jobs_key_check"),
        CheckConstraint(RUN_AT_CHECK, name="jobs_run_at_check"),
        # The fair policies' claim: one tenant's ready jobs, in its own order.
        Index(
            "jobs_tenant_ready_idx",
            "queue",
            "tenant",
            text("priority DESC"),
            "run_at",
            "id",
            postgresql_where=text("status = 'queued'"),
            postgresql_with=READY_INDEX_STORAGE,
        ),
        # The fifo policy's claim: the global order of ready jobs.
        # Its predicate says ``cost > 0`` (always true, jobs_cost_check) so that the per-tenant
        # pick, which does not say it, can never read a tenant's jobs through this index,
        # whatever the statistics.
        Index(
            "jobs_fifo_ready_idx",
            "queue",
            text("priority DESC"),
            "run_at",
            "id",
            postgresql_where=text("status = 'queued' AND cost > 0"),
            postgresql_with=READY_INDEX_STORAGE,
        ),
        # The reaper: running jobs by lease expiry. Rows holding a lease (only running jobs
        # do), not "status = 'running'": the finishes check that, and with that predicate the
        # planner reads every running job through this index for a finish of ten whenever the
        # statistics say few are running.
        Index("jobs_lease_idx", "locked_until", postgresql_where=text("locked_until IS NOT NULL")),
        # Idempotency keys: one live job per task, tenant and key; enqueue_many's
        # ON CONFLICT names these columns and this predicate.
        Index("jobs_key_idx", "task", "tenant", "key", unique=True,
              postgresql_where=text("key IS NOT NULL AND status IN ('queued', 'running')")),
        # The pruner: finished jobs by age.
        Index(
            "jobs_finished_idx",
            "finished_at",
            postgresql_where=text("status IN ('done', 'failed', 'cancelled')"),
        ),
    )
    # Storage parameters are not part of SQLAlchemy's Table options; the migration sets them and
    # metadata.create_all (tests, tools) gets the same through this DDL hook.
    event.listen(jobs, "after_create", DDL(jobs_storage_ddl(schema)))  # type: ignore[no-untyped-call]

    # Operators' explicit per-tenant configuration (fairq tenants set/apply).
    Table(
        "tenants",
        md,
        Column("tenant", Text, nullable=False),
        Column("weight", Float, nullable=False),
        Column("max_running", Integer, nullable=False),
        Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
        PrimaryKeyConstraint("tenant", name="tenants_pkey"),
        CheckConstraint(WEIGHT_CHECK, name="tenants_weight_check"),
        CheckConstraint("max_running >= 0", name="tenants_max_running_check"),
        # Jobs per second (NULL: unlimited) and the bucket's size.
        Column("rate", Float),
        Column("burst", Integer),
        CheckConstraint(RATE_CHECK, name="tenants_rate_check"),
        # The tenant's group (tenant_groups; NULL: the group 'default').
        Column("tenant_group", Text),
    )

    # Tenant groups: a group's weight; its active tenants share it by their own weights.
    Table(
        "tenant_groups",
        md,
        Column("tenant_group", Text, nullable=False),
        Column("weight", Float, nullable=False),
        Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
        PrimaryKeyConstraint("tenant_group", name="tenant_groups_pkey"),
        CheckConstraint(WEIGHT_CHECK, name="tenant_groups_weight_check"),
    )

    # Per (queue, group): group weight / the weights of its active tenants, the factor of its
    # tenants' weights in a claim (weights.sql: effective_weight, refresh_groups). Written only
    # by refresh_groups, which runs as the owner. A factor is at most a group's weight (1000)
    # over a tenant's (0.001); a refresh time is never infinity, so the next refresh comes
    # ('-infinity' is how `groups set` makes every queue's factors due).
    Table(
        "group_schedule",
        md,
        Column("queue", Text, nullable=False),
        Column("tenant_group", Text, nullable=False),
        Column("factor", Float, nullable=False),
        Column("refreshed_at", DateTime(timezone=True), nullable=False),
        PrimaryKeyConstraint("queue", "tenant_group", name="group_schedule_pkey"),
        CheckConstraint("factor > 0 AND factor <= 1000000", name="group_schedule_factor_check"),
        CheckConstraint("refreshed_at < 'infinity'::timestamptz",
                        name="group_schedule_refreshed_at_check"),
    )

    # Key/value settings: the tenant defaults and the maintenance schedule.
    settings = Table(
        "settings",
        md,
        Column("key", Text, nullable=False),
        Column("value", JSONB, nullable=False),
        PrimaryKeyConstraint("key", name="settings_pkey"),
    )
    # Its row-level security: workers write stamps, never tenant defaults.
    # (DDL formats its text with %: the policies' LIKE pattern is escaped for it.)
    event.listen(settings, "after_create",
                 DDL(settings_policy_ddl(schema).replace("%", "%%")))  # type: ignore[no-untyped-call]

    # The scheduler's per (queue, tenant) state. weight and max_running are copies of the
    # tenant's configuration so the claim reads one row; `running` is the exact count of this
    # tenant's running jobs in this queue; `vtime` is its virtual time (service received / weight).
    Table(
        "tenant_schedule",
        md,
        Column("queue", Text, nullable=False),
        Column("tenant", Text, nullable=False),
        Column("weight", Float, nullable=False, server_default=text("1")),
        Column("max_running", Integer, nullable=False, server_default=text("10")),
        Column("running", Integer, nullable=False, server_default=text("0")),
        Column("vtime", Float, nullable=False, server_default=text("0")),
        # True while the tenant has due jobs: the claim that takes its last one clears it.
        Column("active", Boolean, nullable=False, server_default=text("true")),
        # Earliest run_at of a delayed job while inactive: the maintenance wakes it then.
        Column("wake_at", DateTime(timezone=True)),
        Column("claimed_total", BigInteger, nullable=False, server_default=text("0")),
        Column("last_served_at", DateTime(timezone=True)),
        PrimaryKeyConstraint("queue", "tenant", name="tenant_schedule_pkey"),
        CheckConstraint("running >= 0", name="tenant_schedule_running_check"),
        CheckConstraint(WEIGHT_CHECK, name="tenant_schedule_weight_check"),
        # The tenant's rate limit (copied like weight) and its token bucket: `tokens` as of
        # `refilled_at`, NULL = full (rate_limits.sql).
        Column("rate", Float),
        Column("burst", Integer),
        Column("tokens", Float),
        Column("refilled_at", DateTime(timezone=True)),
        CheckConstraint(RATE_CHECK, name="tenant_schedule_rate_check"),
        Column("tenant_group", Text),
        # Time spent throttled (rate_limits.sql): seconds with a due job and no whole token,
        # credited when the interval that throttled_since opened ends.
        Column("throttled_seconds", Float, nullable=False, server_default=text("0")),
        Column("throttled_since", DateTime(timezone=True)),
        # Policy time's expected run time of the tenant's jobs in this queue: a moving average
        # of the run times its finishes report (return_slots), NULL before the first.
        Column("avg_run_s", Float),
        # The claim's tenant pick: runnable tenants in virtual-time order.
        Index(
            "tenant_schedule_runnable_idx",
            "queue",
            "vtime",
            "tenant",
            postgresql_where=text("active AND running < max_running"),
        ),
        # The queue's virtual time when every active tenant is at its cap (queue_vtime); the
        # runnable scan contradicts its predicate, so it cannot be read instead of the above.
        Index("tenant_schedule_capped_idx", "queue", "vtime",
              postgresql_where=text("active AND running >= max_running")),
        # Idle tenants by wake-up time: the maintenance (all queues) and each claim (its queue).
        # Only those with a wake-up: a tenant retired with no delayed job (wake_at NULL) is
        # looked up by nobody, and would take an entry in both at each write of its row.
        Index("tenant_schedule_wake_idx", "wake_at",
              postgresql_where=text("NOT active AND wake_at IS NOT NULL")),
        Index("tenant_schedule_due_idx", "queue", "wake_at",
              postgresql_where=text("NOT active AND wake_at IS NOT NULL")),
    )
    # Slots given back by finishes that found their tenant's row held (by a claim, mostly):
    # the tenant's running count is `running` minus these until whoever holds the row next
    # folds them in (slots.sql). `capped`: the tenant was at its cap when the slot came back, so
    # the next claim of the queue folds it first (the tenant is not in the runnable index).
    Table(
        "slot_returns",
        md,
        Column("queue", Text, nullable=False),
        Column("tenant", Text, nullable=False),
        Column("n", Integer, nullable=False),
        Column("corr", Float, nullable=False, server_default=text("0")),
        Column("runs", Integer, nullable=False, server_default=text("0")),
        Column("run_sum", Float, nullable=False, server_default=text("0")),
        Column("capped", Boolean, nullable=False, server_default=text("false")),
        Column("at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
        CheckConstraint("n >= 0", name="slot_returns_n_check"),
        Index("slot_returns_tenant_idx", "queue", "tenant"),
        Index("slot_returns_capped_idx", "queue", postgresql_where=text("capped")),
    )
    # Slots counted ahead for a worker by a claim that waited for a busy tenant's row: its next
    # claims that find the row held start that many jobs without it (claim.sql, decision 015).
    Table(
        "claim_budgets",
        md,
        Column("queue", Text, nullable=False),
        Column("worker", Text, nullable=False),
        Column("tenant", Text, nullable=False),
        Column("slots", Integer, nullable=False),
        Column("at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
        PrimaryKeyConstraint("queue", "worker", "tenant", name="claim_budgets_pkey"),
        CheckConstraint("slots >= 0", name="claim_budgets_slots_check"),
        Index("claim_budgets_tenant_idx", "queue", "tenant"),
    )
    # Periodic schedules declared in code (App.periodic): the last tick enqueued per (name,
    # tenant). A tick is claimed by a conditional UPDATE in the transaction that enqueues it.
    Table(
        "periodic",
        md,
        Column("name", Text, nullable=False),
        Column("tenant", Text, nullable=False),
        Column("task", Text, nullable=False),
        Column("cron", Text, nullable=False),
        Column("last_tick", DateTime(timezone=True), nullable=False),
        Column("last_job_id", BigInteger),
        Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
        PrimaryKeyConstraint("name", "tenant", name="periodic_pkey"),
    )
    # The live workers (fairq/runtime/registry.py): each writes its row at start and at every
    # beat, and deletes it at a clean stop; one not seen for MISSED_BEATS (fairq.store.workers)
    # of its beat_seconds is dead to the readers (``tenants explain``'s no_worker).
    Table(
        "workers",
        md,
        Column("worker_id", Text, nullable=False),
        Column("queues", ARRAY(Text), nullable=False),
        Column("policy", Text, nullable=False),
        Column("beat_seconds", Float, nullable=False),
        Column("started_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
        Column("seen_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
        PrimaryKeyConstraint("worker_id", name="workers_pkey"),
        CheckConstraint("beat_seconds > 0", name="workers_beat_seconds_check"),
    )
    # The SQL functions (FUNCTION_FILES), once the tables whose row types they take exist.
    for ddl in functions_ddl(schema):
        event.listen(md, "after_create", DDL(ddl))  # type: ignore[no-untyped-call]
    return md
