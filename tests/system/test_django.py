"""examples/django_project: a real Django project on fairq's Tasks backend (Django 5.2 with django-tasks),
its own tests run by Django's test runner against PostgreSQL: enqueue committed and rolled back
with transaction.atomic(), the tenant from the request's organisation, a real
``manage.py fairq_worker`` process running the jobs, results and errors through the
framework's API, and a misspelt option reported by ``manage.py check``. The same project on
Django 6 (its built-in ``django.tasks``) in a venv of Python 3.12 or newer, made for the test,
where such a Python is found (``$FAIRQ_PYTHON_DJANGO6``, ``python3.12``/``python3.13`` on the
PATH, or pyenv's); skipped with the reason where none is."""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import subprocess
import sys

import pytest

from tests.support.db import database_name, drop_database
from tests.support.paths import REPO

PROJECT = REPO / "examples" / "django_project"


def newer_python() -> str | None:
    """A Python of 3.12 or newer (Django 6 needs it), or None."""
    found = [os.environ.get("FAIRQ_PYTHON_DJANGO6"), shutil.which("python3.12"),
             shutil.which("python3.13"),
             *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[23]*/bin/python")))]
    for python in found:  # a pyenv shim of a version not selected is on the PATH but fails
        if python and subprocess.run(
                [python, "-c", "import sys; sys.exit(sys.version_info < (3, 12))"],
                capture_output=True, timeout=60).returncode == 0:
            return python
    return None


@pytest.fixture(scope="module")
def django6(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A venv's python with Django 6 and this checkout of fairq."""
    python = newer_python()
    if python is None:
        pytest.skip("Django 6 needs Python 3.12 or newer: none found (set FAIRQ_PYTHON_DJANGO6)")
    venv = tmp_path_factory.mktemp("django6") / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                          "--disable-pip-version-check", "Django>=6,<6.1", str(REPO)],
                         capture_output=True, text=True, timeout=600)
    if pip.returncode != 0:
        pytest.skip(f"Django 6 could not be installed: {pip.stderr.strip().splitlines()[-1:]}")
    return str(venv / "bin" / "python")


def run_project(admin_dsn: str, python: str) -> subprocess.CompletedProcess[str]:
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
        return subprocess.run([python, "manage.py", "test", "--noinput", "-v", "2"],
                              cwd=PROJECT, env=env, capture_output=True, text=True, timeout=300)
    finally:
        drop_database(admin_dsn, test_db)  # already gone unless the runner could not drop it


def test_the_django_projects_tests_pass(admin_dsn: str) -> None:
    pytest.importorskip("django_tasks", reason="the django extra: pip install -e '.[django]'")
    proc = run_project(admin_dsn, sys.executable)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Ran 6 tests" in proc.stderr and "OK" in proc.stderr, proc.stderr


def test_the_django_projects_tests_pass_on_django_6(admin_dsn: str, django6: str) -> None:
    version = subprocess.run([django6, "-c", "import django; print(django.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert version.startswith("6."), version
    proc = run_project(admin_dsn, django6)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Ran 6 tests" in proc.stderr and "OK" in proc.stderr, proc.stderr
    # The framework is Django's own: django-tasks is not even installed there.
    assert subprocess.run([django6, "-c", "import django_tasks"],
                          capture_output=True).returncode != 0
