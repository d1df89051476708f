"""enqueue in SQL, for every client; idempotency keys

- ``enqueue`` and ``enqueue_many`` (fairq/sql/ddl/enqueue_v1.sql): the one implementation of
  enqueueing, with fairq's checks, the tenants' activation and the NOTIFY. Python calls
  ``enqueue_many``; other languages call ``enqueue(task => ..., tenant => ..., payload => ...)``.
  SECURITY DEFINER with a fixed search_path, EXECUTE revoked from PUBLIC: the producer role gets
  EXECUTE on them instead of writes on the tables (docs/roles.md).
- ``jobs.key``: an idempotency key; ``jobs_key_idx`` makes (task, key) unique among queued and
  running jobs, so a second enqueue with the same task and key returns the live job's id.

Revision ID: 0005
Revises: 0003
Create Date: 2026-11-30
"""
from __future__ import annotations

from importlib import resources

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0007"
branch_labels = None
depends_on = None


def _schema() -> str:
    return str(op.get_context().opts["version_table_schema"])


def enqueue_functions_ddl(schema: str) -> str:
    """enqueue_v1.sql for ``schema``: the functions' history lives in that file."""
    text = resources.files("fairq.sql").joinpath("ddl/enqueue_v1.sql").read_text(encoding="utf-8")
    return text.replace("{schema}", f'"{schema}"').replace("{channel}", f"'fairq_{schema}'")


def upgrade() -> None:
    s = _schema()
    op.add_column("jobs", sa.Column("key", sa.Text()), schema=s)
    op.create_check_constraint("jobs_key_check", "jobs", "length(key) BETWEEN 1 AND 200", schema=s)
    op.create_index("jobs_key_idx", "jobs", ["task", "key"], unique=True, schema=s,
                    postgresql_where=sa.text(
                        "key IS NOT NULL AND status IN ('queued', 'running')"))
    op.execute(sa.text(enqueue_functions_ddl(s)).execution_options(no_parameters=True))


def downgrade() -> None:
    s = _schema()
    q = f'"{s}"'
    op.execute(sa.text(f"DROP FUNCTION {q}.enqueue(text, text, jsonb, text, timestamptz, int, "
                       "float8, int, int, text)"))
    op.execute(sa.text(f"DROP FUNCTION {q}.enqueue_many(text[], text[], jsonb[], text[], "
                       "timestamptz[], float8[], int[], float8[], int[], int[], text[])"))
    op.drop_index("jobs_key_idx", table_name="jobs", schema=s)
    op.drop_constraint("jobs_key_check", "jobs", schema=s)
    op.drop_column("jobs", "key", schema=s)
