"""EXPLAIN guards on the statements that finish jobs: a finish of ten jobs looks them up by id,
whatever the number of running jobs and whatever the statistics say about it.

With statistics taken while nothing ran, a finish_done reads all running jobs through a lease
index whose predicate its ``status = 'running'`` check proves (5,000 running: about 1,000
buffers for ten jobs). jobs_lease_idx's predicate (``locked_until IS NOT NULL``) is one the
finishes do not imply; the last test puts the other predicate back and checks that this guard
sees the scan there.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

import psycopg
import pytest

from benchmarks import claim_plans as cp
from fairq import sql
from fairq.policies import FIFO
from fairq.store import Store
from fairq.store.planner import planner_options
from tests.conftest import create_database, drop_database, dsn_for_db

RUNNING = 2000
FINISH = 10
# By primary key a finish of ten here touched 148-179 buffers (the probes, the tenants' rows and
# the index insertions of ten updates). Through the lease index it touched 203-213 at 2,000
# running jobs, and at 5,000 that index scan alone read 1,012. The index checks below are what
# tell the plans apart at this size; this bound catches a plan that reads far more than either.
# The tenants' rows are written by return_slots, a statement per tenant, whose buffers count
# here too: 254-294 in all for finish_done and finish_failed (134-156 when one statement locked
# and wrote them; the finish's time is the same, about 2.5 ms with its commit).
MAX_BUFFERS = 400
TYPES = {"ids": "bigint[]", "attempts": "int[]", "errors": "text[]", "retry_delays": "float8[]",
         "seconds": "float8", "results": "text[]", "notes": "text[]", "final": "bigint[]",
         "run_seconds": "float8[]", "started": "timestamptz[]"}
Claim = tuple[int, int, datetime]  # id, attempts, started_at: what the worker's writes are fenced on
STATEMENTS = ("finish_done", "finish_failed", "extend_leases", "release_unstarted")


@pytest.fixture(scope="module")
def running(admin_dsn: str, template_db: str) -> Iterator[tuple[str, list[Claim]]]:
    """A database with RUNNING running jobs whose statistics were taken before any ran."""
    name = create_database(admin_dsn, "fairq_finish_plans", template=template_db)
    try:
        dsn = dsn_for_db(admin_dsn, name)
        cp.load(dsn, tenants=4, queued_per_tenant=RUNNING, finished=20_000)  # ends with ANALYZE
        # Keep those statistics: an autoanalyze after the claims below (the embedded server
        # runs autovacuum) let the old index's control test plan by key, and fail, once in CI.
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE {cp.SCHEMA}.jobs SET (autovacuum_enabled = false)")
        store = Store(dsn, cp.SCHEMA, min_size=1, max_size=1)
        try:
            claimed = []
            while len(claimed) < RUNNING:
                claimed += store.claim(FIFO, queue=cp.QUEUE, batch=100, worker="plans")
        finally:
            store.close()
        yield dsn, [(j.id, j.attempts, j.started_at) for j in claimed[:FINISH]]
    finally:
        drop_database(admin_dsn, name)


def _explain(dsn: str, statement: str, jobs: list[Claim], mode: str) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of the prepared statement as a ``mode`` plan, rolled back."""
    text, order = cp.to_dollar(sql.statement(statement, cp.SCHEMA))
    values: Mapping[str, Any] = {
        "ids": [j[0] for j in jobs], "attempts": [j[1] for j in jobs],
        "errors": ["boom"] * len(jobs), "retry_delays": [None] * len(jobs), "seconds": None,
        "results": ['{"rows": 7}'] * len(jobs), "notes": [None] * len(jobs), "final": [],
        "run_seconds": [0.01] * len(jobs), "started": [j[2] for j in jobs]}
    options = f"{planner_options()} -c plan_cache_mode=force_{mode}_plan"
    with psycopg.connect(dsn, options=options) as conn:
        conn.execute(f"PREPARE p ({', '.join(TYPES[o] for o in order)}) AS {text}")
        cur = psycopg.ClientCursor(conn)
        args = ", ".join(["%s"] * len(order))
        # Once first, undone: a session's first call of a plpgsql function (return_slots)
        # reads the catalogs to compile it and plan its statements, once per session.
        cur.execute("SAVEPOINT warm")
        cur.execute(f"EXECUTE p ({args})", [values[o] for o in order])
        cur.execute("ROLLBACK TO SAVEPOINT warm")
        row = cur.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE p ({args})",
                          [values[o] for o in order]).fetchone()
        conn.rollback()
    assert row is not None
    plan: dict[str, Any] = row[0][0]["Plan"]
    return plan


def _indexes(plan: Mapping[str, Any]) -> set[str]:
    found = {str(plan["Index Name"])} if "Index Name" in plan else set()
    for child in plan.get("Plans", []):
        found |= _indexes(child)
    return found


def _buffers(plan: Mapping[str, Any]) -> int:
    return int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))


def _check(dsn: str, statement: str, jobs: list[Claim]) -> list[str]:
    problems = []
    for mode in ("custom", "generic"):
        plan = _explain(dsn, statement, jobs, mode)
        indexes, buffers = _indexes(plan), _buffers(plan)
        if "jobs_pkey" not in indexes or "jobs_lease_idx" in indexes or buffers > MAX_BUFFERS:
            problems.append(f"{statement} {mode}: indexes {sorted(indexes)}, {buffers} buffers")
    return problems


@pytest.mark.parametrize("statement", STATEMENTS)
def test_finish_looks_jobs_up_by_id(running: tuple[str, list[Claim]],
                                    statement: str) -> None:
    dsn, jobs = running
    assert _check(dsn, statement, jobs) == []


def test_guard_sees_the_scan_under_the_old_lease_index(
        admin_dsn: str, running: tuple[str, list[Claim]]) -> None:
    dsn, jobs = running
    lease_index = (f"DROP INDEX {cp.SCHEMA}.jobs_lease_idx; CREATE INDEX jobs_lease_idx "
                   f"ON {cp.SCHEMA}.jobs (locked_until) WHERE %s")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(lease_index % "status = 'running'")
    try:
        problems = _check(dsn, "finish_done", jobs)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(lease_index % "locked_until IS NOT NULL")
    assert any("jobs_lease_idx" in p for p in problems), problems
