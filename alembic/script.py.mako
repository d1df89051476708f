"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
${imports if imports else ""}

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}

# Self-contained (see 0001_baseline.py): the SQL this migration installs and the SQL its
# downgrade restores are written here or in a folder beside it named like this file; never read
# from fairq/ or from an earlier migration's files.


def _schema() -> str:
    return str(op.get_context().opts["version_table_schema"])


def upgrade() -> None:
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    ${downgrades if downgrades else "pass"}
