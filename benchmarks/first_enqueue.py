"""Single enqueues, each in its own transaction (``App.enqueue``): to tenants that already have a
schedule row, and each to a brand-new tenant (the path that creates the row, and since 0002
takes the tenant's settings lock first, decision 020). A fresh database per run, created and
dropped here; prints jobs/s for each shape, medians of the rounds. Uses only the public API, so
the same file runs on older releases (a `git worktree` of the release, PYTHONPATH at it).

    .venv/bin/python -m benchmarks.first_enqueue [--dsn ADMIN_DSN] [--rounds 5] [--jobs 2000]
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import time

import psycopg
from psycopg.conninfo import make_conninfo

import fairq
from fairq import migrate


def run(dsn: str, jobs: int, new: bool, tag: str) -> float:
    with fairq.App(dsn) as app:
        if not new:
            for i in range(10):
                app.enqueue("t", tenant=f"old{i}")
        start = time.perf_counter()
        for i in range(jobs):
            app.enqueue("t", tenant=f"{tag}{i}" if new else f"old{i % 10}")
        return jobs / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--jobs", type=int, default=2000)
    args = p.parse_args()
    name = f"fq_first_{secrets.token_hex(4)}"
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    dsn = make_conninfo(args.dsn, dbname=name)
    try:
        migrate.upgrade(dsn, "fairq")
        rates: dict[str, list[float]] = {"existing": [], "new": []}
        for r in range(args.rounds):
            for shape in (("existing", "new") if r % 2 == 0 else ("new", "existing")):
                rates[shape].append(run(dsn, args.jobs, shape == "new", f"r{r}_"))
        for shape, rs in rates.items():
            print(f"{shape:9} tenants: {statistics.median(rs):8.0f} jobs/s median "
                  f"({', '.join(f'{x:.0f}' for x in rs)})")
        print(f"new/existing: {statistics.median(rates['new']) / statistics.median(rates['existing']):.2f}x")
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
