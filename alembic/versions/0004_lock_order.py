"""lock order: every tenant row written once per statement, in (queue, tenant) order

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-05

The finishes, failures, releases and the reaper give their tenants' slots back through
``return_slots``, one statement per tenant row in (queue, tenant) order; ``enqueue_many`` wakes
its idle tenants the same way after inserting the jobs. A statement that locks a row and then
updates it reaches the row twice when it changed after the statement's snapshot, and waits on
the older version behind a claim queued there for it: the deadlocks this removes
(docs/reliability.md, "Deadlocks"). The SQL it installs and what its downgrade restores are in
the folder beside it, ``0004_lock_order/``.
"""
from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

FOLDER = "0004_lock_order"
UP_FILES = ("slots.sql", "enqueue.sql")
DOWN_FILES = ("down_enqueue.sql",)
DROPPED_BY_DOWNGRADE = ("return_slots(text[], text[], int[], bool[], timestamptz[])",)


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
        text = folder.joinpath(name).read_text(encoding="utf-8")
        op.execute(sa.text(text.replace("{schema}", f'"{s}"').replace("{channel}", f"'fairq_{s}'"))
                   .execution_options(no_parameters=True))


def upgrade() -> None:
    _run(UP_FILES)


def downgrade() -> None:
    _run(DOWN_FILES)
    for signature in DROPPED_BY_DOWNGRADE:
        op.execute(sa.text(f'DROP FUNCTION "{_schema()}".{signature}'))
