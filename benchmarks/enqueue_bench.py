"""Bulk enqueue throughput: ``App.enqueue_many`` of 10,000 jobs over 100 tenants, in a fresh
database (created and dropped here), a few rounds; prints each round and the median jobs/s.

    .venv/bin/python -m benchmarks.enqueue_bench [--dsn ADMIN_DSN] [--rounds 7] [--jobs 10000]
        [--key] [--vs-pgqueuer]

``--vs-pgqueuer``: the "bulk enqueue" column of ``benchmarks.drain_vs_peers`` alone, without
the drains: each round enqueues ``--jobs`` (default 20,000) no-op jobs over 10 tenants into a
fresh database, fairq with ``App.enqueue_many`` (items built before the clock starts) and
PgQueuer with ``Queries.enqueue``'s lists (fairq.bench.peers.pgqueuer_bench), alternating which
goes first; prints each round, the medians and their ratio.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import time

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import fairq
from fairq import migrate
from fairq.bench.peers import pgqueuer_bench


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--jobs", type=int, default=None,
                        help="jobs a round (default 10,000; 20,000 with --vs-pgqueuer)")
    parser.add_argument("--key", action="store_true", help="give every job an idempotency key")
    parser.add_argument("--vs-pgqueuer", action="store_true",
                        help="drain_vs_peers' enqueue figure: fairq against PgQueuer, 10 tenants")
    args = parser.parse_args()
    if args.vs_pgqueuer:
        against_pgqueuer(args.dsn, args.jobs or 20_000, args.rounds)
        return
    jobs = args.jobs or 10_000
    name = f"fairq_enqbench_{secrets.token_hex(4)}"
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    params = conninfo_to_dict(args.dsn)
    params["dbname"] = name
    dsn = make_conninfo(**params)  # type: ignore[arg-type]
    try:
        with fairq.App(dsn) as app:
            app.migrate()
            app.enqueue_many("noop", [("warm", {})])
            rates = []
            for r in range(args.rounds):
                items: list[tuple[str, dict[str, int]] | tuple[str, dict[str, int], str]] = [
                    (f"tenant-{i % 100}", {"n": i}, f"k-{r}-{i}") if args.key
                    else (f"tenant-{i % 100}", {"n": i}) for i in range(jobs)]
                start = time.perf_counter()
                ids = app.enqueue_many("noop", items)
                elapsed = time.perf_counter() - start
                assert len(ids) == jobs
                rates.append(jobs / elapsed)
                print(f"round {r + 1}: {jobs / elapsed:,.0f} jobs/s ({elapsed * 1000:.0f} ms)")
            print(f"median: {statistics.median(rates):,.0f} jobs/s over {args.rounds} rounds")
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))


def fairq_round(admin: str, jobs: int) -> float:
    """drain_vs_peers' fairq enqueue: jobs/s of one ``App.enqueue_many`` into a fresh database."""
    dsn = _scratch(admin, "fairq_enqvs")
    try:
        migrate.upgrade(dsn, "fairq")
        with fairq.App(dsn) as app:
            app.tenants.apply({"defaults": {"weight": 1.0, "max_running": 100_000}})
            items = [(f"t{i % 10}", {}) for i in range(jobs)]  # built before the clock
            start = time.perf_counter()
            app.enqueue_many("noop", items)
            return jobs / (time.perf_counter() - start)
    finally:
        _drop(admin, dsn)


def pgqueuer_round(admin: str, jobs: int) -> float:
    """drain_vs_peers' PgQueuer enqueue (its drain's prefill): jobs/s into a fresh database."""
    dsn = _scratch(admin, "pgq_enqvs")
    try:
        pgqueuer_bench.install(dsn)
        return float(pgqueuer_bench.enqueue(dsn, jobs, tenants=10)["jobs_per_s"])
    finally:
        _drop(admin, dsn)


def against_pgqueuer(admin: str, jobs: int, rounds: int) -> None:
    rates: dict[str, list[float]] = {"fairq": [], "pgqueuer": []}
    for r in range(rounds):
        order = ["fairq", "pgqueuer"] if r % 2 == 0 else ["pgqueuer", "fairq"]
        for who in order:
            rates[who].append((fairq_round if who == "fairq" else pgqueuer_round)(admin, jobs))
        print(f"round {r + 1}: fairq {rates['fairq'][-1]:,.0f} jobs/s, PgQueuer "
              f"{rates['pgqueuer'][-1]:,.0f} jobs/s, "
              f"{rates['fairq'][-1] / rates['pgqueuer'][-1]:.2f}x")
    ours, theirs = statistics.median(rates["fairq"]), statistics.median(rates["pgqueuer"])
    print(f"median over {rounds} rounds, {jobs:,} jobs over 10 tenants: fairq {ours:,.0f} "
          f"jobs/s, PgQueuer {theirs:,.0f} jobs/s, {ours / theirs:.2f}x")


def _scratch(admin: str, prefix: str) -> str:
    name = f"{prefix}_{secrets.token_hex(4)}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return make_conninfo(admin, dbname=name)


def _drop(admin: str, dsn: str) -> None:
    name = str(conninfo_to_dict(dsn)["dbname"])
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))


if __name__ == "__main__":
    main()
