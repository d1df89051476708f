"""Where today's engine is defined: the SQL files of ``fairq/sql/engine/``, in the order they
are created, and the text that creates them in a schema.

The engine (tables, indexes, row-level security, functions, triggers) is described once, in those
files. The migrations in ``alembic/versions/`` each carry the frozen SQL they apply and never
read these files; ``tests/integration/test_engine_sql.py`` proves that the chain of migrations
from an empty database ends exactly where these files say, and ``scripts/draft-migration`` drafts
the next migration from the difference (docs/decisions/021-the-engine-sql-has-a-home.md).
"""

from __future__ import annotations

from importlib import resources

from fairq.names import DEFAULT_SCHEMA, validate_schema_name

__all__ = ["DEFAULT_SCHEMA", "ENGINE_FILES", "JOBS_STORAGE", "engine_ddl", "validate_schema_name"]

# In the order they must be created: a sql function's body is checked against the tables and
# functions it names when it is created (plpgsql bodies are not).
ENGINE_FILES = (
    "tables.sql",       # every table, index and policy
    "vtime.sql",        # queue_vtime
    "rate_limits.sql",  # token bucket, time spent throttled
    "weights.sql",      # effective_weight, group factors
    "settle.sql",       # claim_settle
    "claim.sql",        # claim_fair, wait_and_pick, claim_terms
    "settings.sql",     # settings locks, schedule rows created and repaired, settings versions
    "enqueue.sql",      # enqueue, enqueue_many and their grants
    "traces.sql",       # trace_jobs: the trace contexts of enqueued jobs (fairq.otel)
    "slots.sql",        # return_slots, the slot returns' folds
    "decay.sql",        # decay_usage
    "reasons.sql",      # wait_reason
)

# The jobs table's storage parameters (tables.sql), as PostgreSQL reports them.
JOBS_STORAGE = {
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_analyze_scale_factor": "0.02",
    "autovacuum_vacuum_cost_delay": "0",
    "fillfactor": "90",
}


def engine_text(name: str) -> str:
    """One engine file, unrendered."""
    return resources.files("fairq.sql").joinpath("engine").joinpath(name).read_text(
        encoding="utf-8")


def engine_ddl(schema: str) -> list[str]:
    """The SQL creating today's engine in an empty ``schema``, one text per file of
    ENGINE_FILES: ``{schema}`` is the quoted schema name, ``{channel}`` the schema's NOTIFY
    channel (``fairq.store.listen.channel_for``) as a literal."""
    name = validate_schema_name(schema)
    return [engine_text(f).replace("{schema}", f'"{name}"').replace("{channel}", f"'fairq_{name}'")
            for f in ENGINE_FILES]
