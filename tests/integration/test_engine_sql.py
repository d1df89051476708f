"""The engine's SQL has one home (fairq/sql/engine/): the migration chain from an empty
database produces exactly what those files define, and the comparison notices a difference."""

from __future__ import annotations

import psycopg
import pytest

from fairq import migrate
from fairq.schema import ENGINE_FILES, engine_ddl, engine_text
from tests.support.catalog import differences, snapshot

CHAIN, ENGINE = "fq_chain", "fq_engine"


def build_engine(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        conn.execute(f'CREATE SCHEMA "{schema}"')
        for ddl in engine_ddl(schema):
            conn.execute(ddl)


def test_the_migration_chain_produces_the_engine_files(empty_dsn: str) -> None:
    migrate.upgrade(empty_dsn, CHAIN)
    build_engine(empty_dsn, ENGINE)
    with psycopg.connect(empty_dsn) as conn:
        chain, engine = snapshot(conn, CHAIN), snapshot(conn, ENGINE)
    kinds = {k for k, _ in engine}
    assert kinds == {"column", "table", "constraint", "index", "policy", "function", "trigger"}
    assert len(engine) > 150  # every column, index, function ... not an empty read
    assert differences(chain, engine) == []


def test_the_comparison_notices_a_body_a_grant_a_default_and_a_policy(empty_dsn: str) -> None:
    """A check that could not fail would prove nothing: change one thing of each kind."""
    build_engine(empty_dsn, ENGINE)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        before = snapshot(conn, ENGINE)
        s = f'"{ENGINE}"'
        conn.execute(f"CREATE OR REPLACE FUNCTION {s}.tenants_version() RETURNS trigger "
                     "LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS "
                     "$$ BEGIN NEW.version := OLD.version + 2; RETURN NEW; END $$")
        conn.execute(f"GRANT EXECUTE ON FUNCTION {s}.lock_settings(text[], boolean) TO PUBLIC")
        conn.execute(f"ALTER TABLE {s}.jobs ALTER COLUMN max_attempts SET DEFAULT 6")
        conn.execute(f"ALTER POLICY settings_read ON {s}.settings USING (key <> '')")
        conn.execute(f"ALTER FUNCTION {s}.enqueue(text, text, jsonb, text, timestamptz, int, "
                     "float8, int, int, text) SET search_path = public")
        changed = {(kind, name) for kind, name, _, _ in differences(before, snapshot(conn, ENGINE))}
    assert changed == {
        ("function", "tenants_version()"),
        ("function", "lock_settings(tenants text[], exclusive boolean)"),
        ("column", "jobs.011 max_attempts"),
        ("policy", "settings.settings_read"),
        ("function", "enqueue(task text, tenant text, payload jsonb, queue text, run_at timestamp "
                     "with time zone, priority integer, cost double precision, max_attempts "
                     "integer, lease_seconds integer, key text)"),
    }


def test_every_engine_file_is_listed() -> None:
    """ENGINE_FILES names every file of the folder (a file left out would be in no test).
    (That no function trusts the caller's search_path: tests/integration/test_search_path.py.)"""
    from importlib import resources

    folder = resources.files("fairq.sql").joinpath("engine")
    assert sorted(e.name for e in folder.iterdir() if e.name.endswith(".sql")) \
        == sorted(ENGINE_FILES)
    assert all(engine_text(name).strip() for name in ENGINE_FILES)


@pytest.mark.parametrize("revision", ["0001"])
def test_a_downgrade_to_an_older_revision_and_back_ends_at_the_engine(
        empty_dsn: str, revision: str) -> None:
    migrate.upgrade(empty_dsn, CHAIN)
    migrate.downgrade(empty_dsn, CHAIN, revision)
    assert migrate.current(empty_dsn, CHAIN) == revision
    migrate.upgrade(empty_dsn, CHAIN)
    build_engine(empty_dsn, ENGINE)
    with psycopg.connect(empty_dsn) as conn:
        assert differences(snapshot(conn, CHAIN), snapshot(conn, ENGINE)) == []


def test_the_reviewable_upgrade_sql_also_ends_at_the_engine(empty_dsn: str) -> None:
    """`fairq migrate --sql` from 0001, run by a DBA instead of fairq, gives the same schema
    (the offline text must not double a % the online path sends once)."""
    migrate.upgrade(empty_dsn, CHAIN, "0001")
    script = migrate.upgrade_sql(CHAIN, start="0001")
    with psycopg.connect(empty_dsn, autocommit=True) as conn, conn.transaction():
        conn.execute(script)
    assert migrate.current(empty_dsn, CHAIN) == migrate._script().get_current_head()
    build_engine(empty_dsn, ENGINE)
    with psycopg.connect(empty_dsn) as conn:
        assert differences(snapshot(conn, CHAIN), snapshot(conn, ENGINE)) == []
