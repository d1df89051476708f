"""The test suite's own set-up: its throwaway databases (one documented prefix, a killed run's
swept) and the Node.js client it installs."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg

from tests.support import db
from tests.support.paths import REPO


def _names(admin_dsn: str) -> set[str]:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        return {r[0] for r in conn.execute("SELECT datname FROM pg_database")}


def test_names_carry_the_prefix_this_machine_and_the_creator(dsn: str) -> None:
    name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    assert isinstance(name, str) and name.startswith(db.PREFIX)
    assert db.database_name("fairq_demo_t").startswith(f"{db.PREFIX}{db.MACHINE}_")
    assert len(db.database_name("x" * 80)) <= 63  # PostgreSQL's identifier limit
    assert "fairq_test_" in (REPO / "README.md").read_text()  # the prefix is documented


def test_a_killed_runs_databases_are_swept_and_live_ones_kept(admin_dsn: str) -> None:
    # A process that creates a database and dies without dropping it (as kill -9 would).
    code = ("import sys; from tests.support.db import create_database; "
            "print(create_database(sys.argv[1], 'killed_run'))")
    done = subprocess.run([sys.executable, "-c", code, admin_dsn], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=True)
    left = done.stdout.strip()
    live = db.create_database(admin_dsn, "live_run")  # ours: this process is alive
    foreign = f"{db.PREFIX}{'0000' if db.MACHINE != '0000' else '0001'}_1_other_host"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{foreign}"')
    try:
        assert {left, live, foreign} <= _names(admin_dsn)

        dropped = db.sweep_orphans(admin_dsn)

        assert left in dropped and left not in _names(admin_dsn)
        assert {live, foreign} <= _names(admin_dsn)  # a live creator's, another machine's
    finally:
        for name in (left, live, foreign):
            db.drop_database(admin_dsn, name)


def test_scripts_test_installs_the_node_client_when_npm_is_here(tmp_path: Path) -> None:
    """A checkout without tests/node/node_modules: ./scripts/test runs `npm ci` for it."""
    root = tmp_path / "checkout"
    shutil.copytree(REPO / "scripts", root / "scripts")
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    (root / "tests" / "node").mkdir(parents=True)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "npm").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/npm-args\n'
                              'mkdir -p tests/node/node_modules\n')
    (fake / "npm").chmod(0o755)
    # A venv whose install stamp matches the copied pyproject.toml, so scripts/test installs
    # nothing (the copy has no fairq to install) and runs this interpreter.
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (venv / "bin" / "python").chmod(0o755)
    stamp = hashlib.sha256((root / "pyproject.toml").read_bytes()).hexdigest()[:16]
    (venv / ".fairq-installed-dev-embedded").write_text(stamp + "\n")
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "FAIRQ_VENV": str(venv),
           "FAIRQ_TEST_WORKERS": "0"}
    done = subprocess.run([str(root / "scripts" / "test"), "--version"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "npm-args").read_text().split()[:3] == ["ci", "--prefix", "tests/node"]

    (tmp_path / "npm-args").unlink()  # node_modules is there now: not again
    subprocess.run([str(root / "scripts" / "test"), "--version"], cwd=root, env=env,
                   capture_output=True, text=True, timeout=120, check=True)
    assert not (tmp_path / "npm-args").exists()
