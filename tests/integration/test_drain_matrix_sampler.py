"""The drain matrix's sampler (benchmarks/drain_matrix.py, CLAIMABLE_SQL) counts what its report
says: due jobs of tenants below their cap, and of those the jobs of tenants whose cap exceeds the
worker's concurrency, each up to its cap. Checked against counts made here in Python from the raw
rows, over random states with tenants at, over and under small caps, and past the caps."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import psycopg

import fairq
from benchmarks import drain_matrix as dm

CONCURRENCY = 8


def expected(conn: Any) -> tuple[int, int]:
    jobs: list[tuple[str, str, bool]] = conn.execute(
        f"SELECT tenant, status, run_at <= now() FROM {dm.SCHEMA}.jobs").fetchall()
    caps: dict[str, int] = dict(conn.execute(
        f"SELECT tenant, max_running FROM {dm.SCHEMA}.tenant_schedule").fetchall())
    running = Counter(t for t, st, _ in jobs if st == "running")
    due = Counter(t for t, st, is_due in jobs if st == "queued" and is_due)
    claimable = {t: n for t, n in due.items() if running[t] < caps.get(t, dm.DEFAULT_CAP)}
    uncapped = sum(n for t, n in claimable.items() if caps.get(t, dm.DEFAULT_CAP) > CONCURRENCY)
    # the sampler stops counting at its caps
    return min(sum(claimable.values()), dm.COUNT_CAP), min(uncapped, dm.UNCAPPED_CAP)


def test_the_sampler_counts_claimable_and_uncapped_jobs(dsn: str) -> None:
    app = fairq.App(dsn, schema=dm.SCHEMA)
    try:
        app.enqueue_many("noop", [("whale", {})] * 60 + [(f"s{i}", {}) for i in range(40)]
                         + [(f"t{i % 6}", {}) for i in range(60)])
        app.enqueue_many("noop", [("late", {})] * 5, delay=3600)
        app.tenants.set("whale", max_running=2)
        app.tenants.set("t1", max_running=5)
        app.tenants.set("t2", max_running=1)
        app.tenants.set("t3", max_running=20)  # a cap above the concurrency: "uncapped"
    finally:
        app.close()
    rng = random.Random(13)
    seen = Counter[str]()
    with psycopg.connect(dsn, autocommit=True) as conn:
        dm.sampler_session(conn)  # the plans the benchmark runs it with
        ids = [r[0] for r in conn.execute(f"SELECT id FROM {dm.SCHEMA}.jobs").fetchall()]
        for step in range(30):
            for jid in rng.sample(ids, 12):
                status = rng.choice(["queued", "running", "done"])
                # as a claim and a finish leave them: a running job has a lease
                conn.execute(f"UPDATE {dm.SCHEMA}.jobs SET status = %s, finished_at = "
                             f"CASE WHEN %s = 'done' THEN now() END, locked_until = "
                             f"CASE WHEN %s = 'running' THEN now() + interval '1 hour' END "
                             f"WHERE id = %s", (status, status, status, jid))
            if step % 3 == 0:  # the small-capped tenants at (or one over) their caps
                for tenant, cap in (("whale", 2), ("t1", 5), ("t2", 1)):
                    conn.execute(f"UPDATE {dm.SCHEMA}.jobs SET status = 'queued', "
                                 f"locked_until = NULL WHERE tenant = %s AND status = 'running'",
                                 (tenant,))
                    conn.execute(f"UPDATE {dm.SCHEMA}.jobs SET status = 'running', "
                                 f"locked_until = now() + interval '1 hour' WHERE id IN "
                                 f"(SELECT id FROM {dm.SCHEMA}.jobs WHERE tenant = %s "
                                 f"AND status = 'queued' LIMIT %s)", (tenant, cap + step % 2))
            row = conn.execute(dm.CLAIMABLE_SQL, {"concurrency": CONCURRENCY}).fetchone()
            assert row is not None
            want = expected(conn)
            assert (row[0], row[2]) == want, f"step {step}"
            seen["uncapped < claimable"] += want[1] < want[0]
            seen["at a cap"] += step % 3 == 0
    # the states covered both kinds of tenant, or the test shows nothing
    assert seen["uncapped < claimable"] > 0 and seen["at a cap"] > 0, seen
    # Past the caps the counts stop there: a backlog larger than both, of an uncapped tenant
    app = fairq.App(dsn, schema=dm.SCHEMA)
    try:
        app.enqueue_many("noop", [("big", {})] * (dm.COUNT_CAP + 100))
    finally:
        app.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        dm.sampler_session(conn)
        row = conn.execute(dm.CLAIMABLE_SQL, {"concurrency": CONCURRENCY}).fetchone()
        assert row is not None and expected(conn) == (dm.COUNT_CAP, dm.UNCAPPED_CAP)
        assert (row[0], row[2]) == (dm.COUNT_CAP, dm.UNCAPPED_CAP)


def test_the_sampler_reads_the_cpu_of_the_workers_server_processes_only(dsn: str) -> None:
    """A connection named like a worker's is counted, by its server process's CPU time (here,
    a busy one); the sampler's own and other sessions are not."""
    with psycopg.connect(dsn, autocommit=True, application_name="fairq-worker test") as worker, \
            psycopg.connect(dsn, autocommit=True, application_name="someone else") as other, \
            psycopg.connect(dsn, autocommit=True) as sampler:
        assert sampler.execute(dm.LOCAL_SERVER_SQL).fetchone() == (True,)
        worker_pid, other_pid = worker.info.backend_pid, other.info.backend_pid
        ticks: dict[int, int] = {}
        dm.read_backend_cpu(sampler, ticks)
        assert set(ticks) == {worker_pid}
        first = ticks[worker_pid]
        worker.execute("SELECT count(*) FROM generate_series(1, 3000000)")
        other.execute("SELECT count(*) FROM generate_series(1, 3000000)")
        dm.read_backend_cpu(sampler, ticks)
        assert set(ticks) == {worker_pid} and ticks[worker_pid] > first
        assert dm.process_ticks(other_pid) is not None and dm.process_ticks(2 ** 22 + 1) is None
