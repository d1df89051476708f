"""scripts/draft-migration drafts the next migration from the engine files' difference: its
upgrade takes the chain to the edited engine, its downgrade back."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import psycopg

from fairq import migrate
from fairq.schema import ENGINE_FILES
from tests.support.catalog import differences, snapshot

ROOT = Path(__file__).resolve().parents[2]


def render(text: str, schema: str) -> str:
    return text.replace("{schema}", f'"{schema}"').replace("{channel}", f"'fairq_{schema}'")


def test_a_changed_and_a_new_function_are_drafted_both_ways(
        empty_dsn: str, admin_dsn: str, tmp_path: Path) -> None:
    engine = tmp_path / "engine"
    shutil.copytree(ROOT / "fairq" / "sql" / "engine", engine)
    decay = engine / "decay.sql"
    text = decay.read_text(encoding="utf-8")
    assert "written int := 0;" in text
    decay.write_text(text.replace("written int := 0;", "written int := 0;  -- counted")
                     + "\nCREATE OR REPLACE FUNCTION {schema}.decay_twice(x float8) RETURNS "
                       "float8 LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp "
                       "AS $$ SELECT x * 0.25 $$;\n", encoding="utf-8")
    versions = tmp_path / "versions"
    versions.mkdir()
    shutil.copy(ROOT / "alembic" / "versions" / "0002_settings_in_step.py", versions)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "draft-migration"), "decay counted",
         "--dsn", admin_dsn, "--engine-dir", str(engine), "--versions-dir", str(versions)],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "changed  function   decay_usage" in proc.stdout
    assert "new      function   decay_twice" in proc.stdout
    head = migrate._script().get_current_head()
    number = f"{int(head or 0) + 1:04d}"
    folder = versions / f"{number}_decay_counted"
    assert (versions / f"{number}_decay_counted.py").exists()
    assert sorted(p.name for p in folder.iterdir()) == ["decay.sql", "downgrade.sql",
                                                        "upgrade.sql"]
    # Applied by hand in its order: the chain plus the draft is the edited engine ...
    migrate.upgrade(empty_dsn, "fq_chain")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        with conn.transaction():
            conn.execute('CREATE SCHEMA "fq_engine"')
            for f in ENGINE_FILES:
                conn.execute(render((engine / f).read_text(encoding="utf-8"), "fq_engine"))
        before = snapshot(conn, "fq_chain")
        with conn.transaction():
            for f in ("upgrade.sql", "decay.sql"):
                conn.execute(render((folder / f).read_text(encoding="utf-8"), "fq_chain"))
        assert differences(snapshot(conn, "fq_chain"), snapshot(conn, "fq_engine")) == []
        # ... and its downgrade is the chain again.
        with conn.transaction():
            conn.execute(render((folder / "downgrade.sql").read_text(encoding="utf-8"),
                                "fq_chain"))
        assert differences(snapshot(conn, "fq_chain"), before) == []
