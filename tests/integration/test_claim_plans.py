"""EXPLAIN guards on every claim statement (property 7 of docs/algorithm.md): the claim is an index scan
that a Limit stops after its batch, and what it touches does not grow with the number of
tenants or of finished jobs.

Each statement is explained with each policy's parameters, at 10 and at 100,000 tenants, both
with many finished jobs, as a custom plan and as a generic plan of the statement psycopg itself
prepared (``EXPLAIN (ANALYZE, BUFFERS) EXECUTE``, rolled back). The loading and EXPLAIN tooling is
``benchmarks/claim_plans.py``; the last test proves the guard fails on a plan that scans.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from benchmarks import claim_plans as cp
from fairq.store.planner import planner_options
from tests.conftest import create_database, drop_database, dsn_for_db

SMALL, BIG = 10, 100_000
BATCH = 10
FINISHED = 100_000
# Buffers a claim may touch at 100,000 tenants: 3x those at 10 tenants plus this much (index
# descents are a level deeper and the tenant rows spread over more pages).
SLACK_BUFFERS = 150
SLACK_ROWS = 30


@pytest.fixture(scope="module")
def sized(admin_dsn: str, template_db: str) -> Iterator[dict[int, str]]:
    """Two migrated databases: 10 tenants (100 queued jobs each) and 100,000 tenants (1 each),
    each with 100,000 finished jobs."""
    names = {n: create_database(admin_dsn, "fairq_plans", template=template_db) for n in (SMALL, BIG)}
    try:
        dsns = {n: dsn_for_db(admin_dsn, name) for n, name in names.items()}
        cp.load(dsns[SMALL], tenants=SMALL, queued_per_tenant=100, finished=FINISHED)
        cp.load(dsns[BIG], tenants=BIG, queued_per_tenant=1, finished=FINISHED)
        yield dsns
    finally:
        for name in names.values():
            drop_database(admin_dsn, name)


def _explain(dsn: str, statement: str, policy: str, settings: dict[str, str] | None = None,
             fairq_session: bool = True) -> dict[str, cp.PlanSummary]:
    # Explained under the planner settings fairq's own sessions run with (Store), unless the
    # test needs a plain session (whose first execution does not cache a generic plan).
    options = planner_options() if fairq_session else ""
    with psycopg.connect(dsn, autocommit=True, options=options) as conn:
        plans = cp.explain_case(conn, statement, policy, batch=BATCH, settings=settings)
    return {mode: summary for mode, (_doc, summary) in plans.items()}


def _required_indexes(statement: str) -> set[str]:
    """The ready/runnable indexes a statement must read under a Limit."""
    if statement == "claim_fifo":
        return {"jobs_fifo_ready_idx"}
    return {"tenant_schedule_runnable_idx", "jobs_tenant_ready_idx"}


def _max_index_rows(statement: str) -> int:
    """Rows any one index scan may touch: a batch (plus the probe for the next); the finished
    jobs and the other tenants must not show up here."""
    return 3 * BATCH + 2


@pytest.mark.parametrize(("label", "policy", "statement"), cp.CASES, ids=[c[0] for c in cp.CASES])
def test_claim_plan_is_bounded(sized: dict[int, str], label: str, policy: str, statement: str) -> None:
    small = _explain(sized[SMALL], statement, policy)
    big = _explain(sized[BIG], statement, policy)
    for mode in ("custom", "generic"):
        s, b = small[mode], big[mode]
        ctx = f"{label} {mode}: small={s} big={b}"
        # The mode really is what we asked for: the queue is $1 in a generic plan only.
        assert s.generic == b.generic == (mode == "generic"), ctx
        assert s.returned == b.returned == BATCH, ctx
        # Plan shape. At 10 tenants the planner may read the one-page tenant_schedule by Seq
        # Scan (cheaper than the index); the buffer bound below keeps that honest.
        assert not [x for x in s.seq_scans if "jobs" in x], ctx
        assert not b.seq_scans, ctx
        assert _required_indexes(statement) <= set(b.limited_indexes), ctx
        assert "jobs_tenant_ready_idx" in s.limited_indexes or statement == "claim_fifo", ctx
        assert "jobs_fifo_ready_idx" in s.limited_indexes or statement != "claim_fifo", ctx
        for idx, rows in (*s.index_scans.items(), *b.index_scans.items()):
            assert rows <= _max_index_rows(statement), f"{idx} touched {rows} rows; {ctx}"
        # Work is essentially the same at 10 and at 100,000 tenants.
        assert b.buffers <= 3 * s.buffers + SLACK_BUFFERS, ctx
        assert b.rows_touched <= 3 * s.rows_touched + SLACK_ROWS, ctx
        assert b.planning_buffers <= 3 * s.planning_buffers + SLACK_BUFFERS, ctx


def test_guard_fails_on_a_scanning_plan(sized: dict[int, str]) -> None:
    """The guard's own check: with index scans disabled the fifo claim must trip it.

    Run on the 10-tenant database (100,000 finished jobs): a per-row tenant probe without
    indexes over 100,000 tenants would take minutes."""
    scan = _explain(sized[SMALL], "claim_fifo", "fifo",
                    {"enable_indexscan": "off", "enable_indexonlyscan": "off", "enable_bitmapscan": "off"},
                    fairq_session=False)
    small = _explain(sized[SMALL], "claim_fifo", "fifo")
    for mode in ("custom", "generic"):
        assert any("jobs" in x for x in scan[mode].seq_scans), scan[mode]
        assert scan[mode].buffers > 3 * small[mode].buffers + SLACK_BUFFERS, (scan[mode], small[mode])
        assert scan[mode].rows_touched > 3 * small[mode].rows_touched + SLACK_ROWS


@pytest.fixture(scope="module")
def shared_table(admin_dsn: str, template_db: str) -> Iterator[str]:
    """Two queues in one table: 4 tenants with 20,000 queued jobs each, and 100,000 one-job
    tenants whose names ('t1'..) include the small queue's. The tenant statistics then say
    "about one job per tenant", which is wrong for the small queue."""
    name = create_database(admin_dsn, "fairq_plans", template=template_db)
    try:
        dsn = dsn_for_db(admin_dsn, name)
        cp.load(dsn, tenants=4, queued_per_tenant=20_000, finished=0, queue="few")
        cp.load(dsn, tenants=BIG, queued_per_tenant=1, finished=FINISHED, queue="many")
        yield dsn
    finally:
        drop_database(admin_dsn, name)


@pytest.mark.parametrize(("label", "policy", "statement"), cp.CASES, ids=[c[0] for c in cp.CASES])
def test_claim_plan_survives_misleading_statistics(shared_table: str, label: str, policy: str,
                                                   statement: str, request: pytest.FixtureRequest) -> None:
    """Found by benchmarks/claim_bench.py: with these statistics claim_fifo's custom plan turns
    the EXISTS into a nested loop from tenant_schedule, reads all 80,000 queued jobs of the small
    queue and sorts them (~0.7 s per claim of 10). The fair statements stay bounded.

    Explained on a plain session (default planner settings, seq scans and hash joins allowed):
    the plans must not need fairq's session settings to stay bounded. On PostgreSQL 18 the generic
    plan of claim_fifo once joined its batch to jobs by a hash join over a Seq Scan (6,040
    buffers): a generic plan estimates LIMIT $n as a tenth of the backlog. The statements now
    fetch those rows by key = ANY (array), and no plan here may scan either table."""
    with psycopg.connect(shared_table, autocommit=True) as conn:
        # Fresh statistics samples each time: the bad plan depended on what ANALYZE sampled.
        conn.execute("ANALYZE fairq.jobs")
        conn.execute("ANALYZE fairq.tenant_schedule")
        plans = cp.explain_case(conn, statement, policy, batch=BATCH, queue="few")
    for mode, (_doc, s) in plans.items():
        assert s.returned == BATCH, (mode, s)
        assert not s.seq_scans, (mode, s)
        for idx, rows in s.index_scans.items():
            assert rows <= _max_index_rows(statement), f"{mode}: {idx} touched {rows} rows; {s}"
