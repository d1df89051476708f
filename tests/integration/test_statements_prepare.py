"""Every named statement in fairq/sql/*.sql parses and plans on this server (PREPARE).

Run on PostgreSQL 15 (the system server) and on the embedded 18 (CI's PostgreSQL 18 subset):
a statement that only one version accepts fails here before any behaviour test meets it.
The parameters' types are left for the server to infer, as a non-Python client's would be.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import psycopg
import pytest

from fairq import sql
from tests.support.db import create_database, drop_database, dsn_for_db

SCHEMA = "fairq"
# Utility statements cannot be prepared; each is run by its own test (maintenance, roles, demo).
NOT_PREPARABLE = {"vacuum_tenant_schedule", "drop_schema"}
PLACEHOLDER = re.compile(r"%\((\w+)\)[sb]")


def _preparable() -> list[str]:
    """The statements rendered with the schema alone (the roles' GRANTs also take a role)."""
    out = []
    for name in sql.names():
        if name in NOT_PREPARABLE or name.startswith("roles_"):
            continue
        out.append(name)
    return out


def positional(text: str) -> str:
    """psycopg's %(name)s placeholders as $1, $2, ... (one number per name)."""
    names: list[str] = []

    def number(m: re.Match[str]) -> str:
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"

    return PLACEHOLDER.sub(number, text).replace("%%", "%")


@pytest.fixture(scope="module")
def conn(admin_dsn: str, template_db: str) -> Iterator[psycopg.Connection]:
    db = create_database(admin_dsn, "fq_prepare", template=template_db)
    try:
        with psycopg.connect(dsn_for_db(admin_dsn, db), autocommit=True) as c:
            available = c.execute("SELECT 1 FROM pg_available_extensions "
                                  "WHERE name = 'pg_stat_statements'").fetchone()
            if available:
                c.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            yield c
    finally:
        drop_database(admin_dsn, db)


def test_the_list_is_not_empty() -> None:
    assert len(_preparable()) > 20


@pytest.mark.parametrize("name", _preparable())
def test_statement_prepares(conn: psycopg.Connection, name: str) -> None:
    if name.startswith("pgss_") and not conn.execute(
            "SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements'").fetchone():
        pytest.skip("pg_stat_statements is not available on this server")
    conn.execute(f"PREPARE fq_check AS {positional(sql.statement(name, SCHEMA))}")
    conn.execute("DEALLOCATE fq_check")
