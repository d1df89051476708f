"""Bulk enqueue throughput: ``App.enqueue_many`` of 10,000 jobs over 100 tenants, in a fresh
database (created and dropped here), a few rounds; prints each round and the median jobs/s.

    .venv/bin/python -m benchmarks.enqueue_bench [--dsn ADMIN_DSN] [--rounds 7] [--jobs 10000]
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--key", action="store_true", help="give every job an idempotency key")
    args = parser.parse_args()
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
                    else (f"tenant-{i % 100}", {"n": i}) for i in range(args.jobs)]
                start = time.perf_counter()
                ids = app.enqueue_many("noop", items)
                elapsed = time.perf_counter() - start
                assert len(ids) == args.jobs
                rates.append(args.jobs / elapsed)
                print(f"round {r + 1}: {args.jobs / elapsed:,.0f} jobs/s ({elapsed * 1000:.0f} ms)")
            print(f"median: {statistics.median(rates):,.0f} jobs/s over {args.rounds} rounds")
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))


if __name__ == "__main__":
    main()
