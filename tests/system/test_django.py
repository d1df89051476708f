"""examples/django_project: a real Django 5.2 project (django-tasks) on fairq's Tasks backend,
its own tests run by Django's test runner against PostgreSQL: enqueue committed and rolled back
with transaction.atomic(), the tenant from the request's organisation, a real
``manage.py fairq_worker`` process running the jobs, results and errors through the
framework's API, and a misspelt option reported by ``manage.py check``. Django 6 needs Python
3.12, which this machine does not have (docs/django.md)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest

from tests.support.db import database_name, drop_database
from tests.support.paths import REPO

PROJECT = REPO / "examples" / "django_project"
pytest.importorskip("django_tasks", reason="the django extra: pip install -e '.[django]'")


def test_the_django_projects_tests_pass(admin_dsn: str) -> None:
    import psycopg

    params = psycopg.conninfo.conninfo_to_dict(admin_dsn)
    # Django's test runner makes and drops this database; named as the suite's own, so a run
    # killed before the runner dropped it is swept by the next (tests/support/db.py).
    test_db = database_name("django")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "FAIRQ_", "DJANGO_")) and k != "PYTHONPATH"}
    env.update(DJANGO_DB_NAME=f"fairq_dj_{secrets.token_hex(4)}", DJANGO_TEST_DB_NAME=test_db,
               FAIRQ_SCHEMA=f"fq_{secrets.token_hex(4)}",
               DJANGO_DB_HOST=str(params.get("host", "127.0.0.1")),
               DJANGO_DB_PORT=str(params.get("port", 5432)),
               DJANGO_DB_USER=str(params.get("user", "postgres")),
               DJANGO_DB_PASSWORD=str(params.get("password", "")))
    try:
        proc = subprocess.run([sys.executable, "manage.py", "test", "--noinput", "-v", "2"],
                              cwd=PROJECT, env=env, capture_output=True, text=True, timeout=300)
    finally:
        drop_database(admin_dsn, test_db)  # already gone unless the runner could not drop it
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Ran 6 tests" in proc.stderr and "OK" in proc.stderr, proc.stderr
