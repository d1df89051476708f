"""jobs_lease_idx indexes rows that hold a lease (locked_until IS NOT NULL), not status = 'running'

Why: a finish (finish_done, finish_failed, extend_leases, release_unstarted) looks its jobs up
by id and checks status = 'running'. That check proved the old index's predicate, so whenever
the statistics said few jobs were running (an ANALYZE at a quiet moment) the planner read the
whole lease index, every running job, for a finish of ten: 1,012 buffers and 11 ms with 5,000
running, growing with the running count. The reaper's and the exporter's
``locked_until < now()`` still imply the new predicate; the finishes' conditions do not, so they
can only use the primary key. The rows indexed are the same: only running jobs hold a lease.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _schema() -> str:
    return str(op.get_context().opts["version_table_schema"])


def _replace(where: str) -> None:
    # Built beside the old index, then swapped. Like any CREATE INDEX in a migration's
    # transaction, the build blocks writes to jobs while it reads the table, until the commit.
    s = _schema()
    op.create_index("jobs_lease_idx_new", "jobs", ["locked_until"], schema=s,
                    postgresql_where=sa.text(where))
    op.drop_index("jobs_lease_idx", table_name="jobs", schema=s)
    op.execute(sa.text(f'ALTER INDEX "{s}".jobs_lease_idx_new RENAME TO jobs_lease_idx'))


def upgrade() -> None:
    _replace("locked_until IS NOT NULL")


def downgrade() -> None:
    _replace("status = 'running'")
