"""VACUUM of tenant_schedule never tries to truncate the table (``vacuum_truncate = false``)

Why: a VACUUM that finds empty pages at the end of a table tries to take an ACCESS EXCLUSIVE
lock to cut them off, without waiting in the lock queue: it retries every 50 ms for up to 5 s,
then gives up. tenant_schedule is written by every claim and finish, so on a busy queue the lock
is never free: each of the workers' VACUUMs (fairq.maintenance.ScheduleVacuum, meant to run
every second or so) slept up to 5 s in that wait, at one tenant 10 VACUUMs in a claim_bench run
where 22 ran without it; an autovacuum of the table does the same. The table is small and its
freed pages are reused by the next updates: nothing is lost by keeping them. A storage
parameter (fairq.schema.SCHEDULE_STORAGE), so every VACUUM of the table (the workers',
autovacuum, an operator's) obeys it.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from fairq.schema import schedule_storage_ddl

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def _schema() -> str:
    return str(op.get_context().opts["version_table_schema"])


def upgrade() -> None:
    op.execute(sa.text(schedule_storage_ddl(_schema())))


def downgrade() -> None:
    op.execute(sa.text(f'ALTER TABLE "{_schema()}".tenant_schedule RESET (vacuum_truncate)'))
