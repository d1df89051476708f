"""A worker's start checks the schema's revision against this fairq's head read from the
migration files, without Alembic (its imports were half of an empty worker run's 0.75 s)."""

from __future__ import annotations

import subprocess
import sys

from fairq import migrate
from tests.support.paths import REPO


def test_the_files_head_is_alembics_head() -> None:
    assert migrate.head_of_files() is not None
    assert migrate.head_of_files() == migrate.head()


def test_importing_migrate_loads_no_alembic_or_sqlalchemy() -> None:
    code = ("import sys, fairq.migrate, fairq.runtime; "
            "print(sorted(m for m in ('alembic', 'sqlalchemy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"
