"""policy time: tenants share worker time, charged by expected run time and corrected at finish

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-05

- ``tenant_schedule.avg_run_s``: a tenant's expected run time in a queue, a moving average of
  the run times its finishes report (return_slots keeps it, under every policy).
- ``jobs.charged_s``: what a claim under policy ``time`` charged the job (NULL otherwise); its
  finish corrects the tenant's virtual time by the time it ran minus this.
- claim_fair and wait_and_pick take ``by_time``; return_slots takes the corrections and the
  run times. Their old signatures are dropped (a call names its arguments' types).
- decay_usage: the usage decay of workers with a half-life.

Self-contained: the functions it installs are in ``0005_worker_time/``, the ones its downgrade
puts back in ``0005_worker_time/down/`` (copies of 0003's claim.sql and 0004's slots.sql).
"""
from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

FOLDER = "0005_worker_time"
UP_FILES = ("slots.sql", "claim.sql", "decay.sql")
DOWN_FILES = ("down/slots.sql", "down/claim.sql")
OLD = ("claim_fair(text, int, bool, bool, float8, bool, text)",
       "wait_and_pick(text, int, bool, bool)",
       "return_slots(text[], text[], int[], bool[], timestamptz[])")
NEW = ("claim_fair(text, int, bool, bool, bool, float8, bool, text)",
       "wait_and_pick(text, int, bool, bool, bool)",
       "return_slots(text[], text[], int[], bool[], timestamptz[], float8[], int[], float8[])",
       "decay_usage(text, float8)")


def _schema() -> str:
    return str(op.get_context().opts["version_table_schema"])


def _folder() -> Traversable:
    """This migration's SQL: package data of ``fairq.migrations.versions`` in an installed
    fairq; in a checkout, beside this file."""
    try:
        return resources.files("fairq.migrations.versions").joinpath(FOLDER)
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent / FOLDER


def _run(files: tuple[str, ...]) -> None:
    s = _schema()
    folder = _folder()
    for name in files:
        node = folder
        for part in name.split("/"):
            node = node.joinpath(part)
        text = node.read_text(encoding="utf-8")
        op.execute(sa.text(text.replace("{schema}", f'"{s}"').replace("{channel}", f"'fairq_{s}'"))
                   .execution_options(no_parameters=True))


def _drop(signatures: tuple[str, ...]) -> None:
    for signature in signatures:
        op.execute(sa.text(f'DROP FUNCTION "{_schema()}".{signature}'))


def upgrade() -> None:
    s = _schema()
    op.execute(sa.text(f'ALTER TABLE "{s}".tenant_schedule ADD COLUMN avg_run_s float8'))
    op.execute(sa.text(f'ALTER TABLE "{s}".jobs ADD COLUMN charged_s float8'))
    _drop(OLD)
    _run(UP_FILES)


def downgrade() -> None:
    s = _schema()
    _drop(NEW)
    _run(DOWN_FILES)
    op.execute(sa.text(f'ALTER TABLE "{s}".jobs DROP COLUMN charged_s'))
    op.execute(sa.text(f'ALTER TABLE "{s}".tenant_schedule DROP COLUMN avg_run_s'))
