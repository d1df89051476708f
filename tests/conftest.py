"""Test fixtures: a migrated template database built once, a fresh database per test.

By default the tests use the system PostgreSQL (``FAIRQ_TEST_DSN``, default
``postgresql://postgres@127.0.0.1:5432/postgres``). ``FAIRQ_TEST_EMBEDDED=1`` runs the same
suite against the embedded PostgreSQL 18 instead. The databases they make are named
``fairq_test_...`` and dropped even after a killed run (tests/support/db.py).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fairq import migrate
from fairq.store import Store
from tests.support.db import SCHEMA, create_database, drop_database, dsn_for_db, sweep_orphans

pytest_plugins = ("tests.support.skip_summary",)  # the run ends with what it skipped and how to install it

SLOW_COMMAND = "FAIRQ_SLOW=1 ./scripts/test -m slow"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` (a fresh checkout's .venv, long soaks) run only when asked."""
    if os.environ.get("FAIRQ_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason=f"slow: run with {SLOW_COMMAND}")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def admin_dsn() -> Iterator[str]:
    """The server the tests create their databases on: the system PostgreSQL, or with
    ``FAIRQ_TEST_EMBEDDED=1`` an embedded PostgreSQL 18 started for this session and stopped
    after it (``FAIRQ_TEST_EMBEDDED_HOME`` reuses one you keep)."""
    if os.environ.get("FAIRQ_TEST_EMBEDDED") != "1":
        admin = os.environ.get("FAIRQ_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
        sweep_orphans(admin)  # what a killed run left behind
        yield admin
        return
    from fairq import embedded

    given = os.environ.get("FAIRQ_TEST_EMBEDDED_HOME")
    # As root the server runs as its own unprivileged user, which must be able to enter the
    # folder: pytest's temporary folders are private to root, so make one under /var/tmp.
    home = Path(given) if given else Path(tempfile.mkdtemp(prefix="fairq-test-pg-", dir="/var/tmp"))
    if not given:
        home.chmod(0o755)
    try:
        yield embedded.ensure_server(home)
    finally:
        if not given:
            embedded.stop_server(home)
            shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def template_db(admin_dsn: str) -> Iterator[str]:
    """A database migrated once per session; each test copies it (CREATE DATABASE ... TEMPLATE)."""
    name = create_database(admin_dsn, "fairq_tpl")
    try:
        migrate.upgrade(dsn_for_db(admin_dsn, name), SCHEMA)
        yield name
    finally:
        drop_database(admin_dsn, name)


@pytest.fixture
def empty_dsn(admin_dsn: str) -> Iterator[str]:
    """A fresh database with nothing in it, dropped afterwards."""
    name = create_database(admin_dsn, "fairq_e")
    try:
        yield dsn_for_db(admin_dsn, name)
    finally:
        drop_database(admin_dsn, name)


@pytest.fixture
def dsn(admin_dsn: str, template_db: str) -> Iterator[str]:
    """A fresh, migrated database for one test, dropped afterwards."""
    name = create_database(admin_dsn, "fairq_t", template=template_db)
    try:
        yield dsn_for_db(admin_dsn, name)
    finally:
        drop_database(admin_dsn, name)


@pytest.fixture
def store(dsn: str) -> Iterator[Store]:
    s = Store(dsn, SCHEMA, max_size=8)
    s.pool.wait()
    try:
        yield s
    finally:
        s.close()

