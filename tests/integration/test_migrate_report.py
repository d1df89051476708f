"""Concurrent ``fairq migrate`` runs on one schema each report what they did themselves: one
created the tables, the others found them there."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg

FAIRQ = Path(sys.executable).parent / "fairq"


def waiting_on_advisory_locks(dsn: str) -> int:
    with psycopg.connect(dsn) as c:
        row = c.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                        "AND NOT granted AND database = (SELECT oid FROM pg_database "
                        "WHERE datname = current_database())").fetchone()
    assert row is not None
    return int(row[0])


def test_three_concurrent_migrates_create_the_tables_once(dsn: str) -> None:
    """The three are lined up behind the migrations' own lock, held here, so each of them has
    started before any creates a table; then they go."""
    schema = "fresh_schema"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRQ_")}
    with psycopg.connect(dsn, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(hashtext(%s))", (f"fairq.migrate.{schema}",))
        runs = [subprocess.Popen([str(FAIRQ), "migrate", "--dsn", dsn, "--schema", schema],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True) for _ in range(3)]
        deadline = time.monotonic() + 60
        while waiting_on_advisory_locks(dsn) < 3:
            assert time.monotonic() < deadline, "the three runs never queued up"
            assert all(r.poll() is None for r in runs), [r.communicate() for r in runs]
            time.sleep(0.05)
        holder.execute("SELECT pg_advisory_unlock(hashtext(%s))", (f"fairq.migrate.{schema}",))
        outputs = [r.communicate(timeout=120) for r in runs]
    assert [r.returncode for r in runs] == [0, 0, 0], outputs
    said = sorted(out.strip() for out, _ in outputs)
    created = [line for line in said if "created fairq's tables" in line]
    assert len(created) == 1, said
    others = [line for line in said if line not in created]
    assert len(others) == 2 and all("nothing to do" in line for line in others), said
