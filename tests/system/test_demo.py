"""``fairq demo`` end to end against the test PostgreSQL: the table, the verdict, no leftovers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest

from tests.conftest import create_database, drop_database, dsn_for_db

ROW = re.compile(r"^(fifo|weighted)\s+([\d.]+) s\s+([\d.]+) s\s+([\d.]+) s$", re.MULTILINE)


@pytest.fixture
def bare_dsn(admin_dsn: str) -> Iterator[str]:
    name = create_database(admin_dsn, "fairq_demo_t")
    try:
        yield dsn_for_db(admin_dsn, name)
    finally:
        drop_database(admin_dsn, name)


def _schemas(dsn: str) -> set[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {r[0] for r in conn.execute("SELECT nspname FROM pg_namespace").fetchall()}


def _demo(args: list[str], env_url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FAIRQ_DATABASE_URL", "FAIRQ_SCHEMA")}
    if env_url:
        env["FAIRQ_DATABASE_URL"] = env_url
    return subprocess.run([sys.executable, "-m", "fairq", "demo", "--quick", *args], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("via", ["--dsn", "FAIRQ_DATABASE_URL"])
def test_demo_prints_the_table_and_leaves_nothing(bare_dsn: str, via: str) -> None:
    before = _schemas(bare_dsn)
    proc = (_demo(["--dsn", bare_dsn]) if via == "--dsn" else _demo([], env_url=bare_dsn))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    rows = {m.group(1): [float(x) for x in m.groups()[1:]] for m in ROW.finditer(out)}
    assert set(rows) == {"fifo", "weighted"}, out
    fifo_p95, _, fifo_drain = rows["fifo"]
    fair_p95, _, fair_drain = rows["weighted"]
    # Under FIFO every small job starts after the whole backlog; under weighted in the first turns.
    assert fifo_p95 > fair_p95, out
    assert fifo_drain > 0 and fair_drain > 0
    assert "Under FIFO the 10 small tenants queued behind tenant-1" in out
    assert "fairq web --demo" in out  # the one command that opens the console on a live demo
    # Not a TTY: plain progress lines, no cursor movement.
    assert "\x1b[" not in out
    assert re.search(r"^  fifo .*tenant-1 \d+/200", out, re.MULTILINE), out
    assert _schemas(bare_dsn) == before


def test_demo_unreachable_database_is_one_line() -> None:
    proc = _demo(["--dsn", "postgresql://postgres@127.0.0.1:1/nowhere"])
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "cannot connect" in proc.stderr, proc.stderr
