"""Python CPU of one claim statement: psycopg's %(name)s path against the store's positional one.

    python -m benchmarks.claim_parse [--schemas fairq,ssss...] [--rounds 6] [--claims 1000]

psycopg caches its parse of a query's placeholders only for texts up to 4,096 bytes; claim_fair
is near that with the default schema and past it with a longer schema name. This executes
claim_fair on an empty queue through both paths in one process, alternating, and reports the
process's CPU time (time.process_time) per execution: what the conversion costs the worker.
The server's work is the same in both (the same text reaches it).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.rows import dict_row

from benchmarks import claim_plans as cp
from fairq import migrate, sql
from fairq.policies import get_policy
from fairq.store import Store

Run = Callable[[Store, dict[str, Any]], list[dict[str, Any]]]


def through_psycopg(store: Store, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The %(name)s text through a plain cursor: psycopg converts it (cached up to 4 KiB)."""
    with store.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        cur.execute(sql.statement("claim_fair", store.schema), params)
        return cur.fetchall()


def positional(store: Store, params: dict[str, Any]) -> list[dict[str, Any]]:
    """What Store.claim does: the text converted once, through a RawCursor."""
    stmt = sql.positional("claim_fair", store.schema)
    with store.pool.connection() as conn, psycopg.RawCursor(conn, row_factory=dict_row) as cur:
        cur.execute(stmt.text, stmt.values(params))
        return cur.fetchall()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", default=cp.DEFAULT_DSN,
                    help="admin DSN; a database is created there and dropped")
    ap.add_argument("--schemas", default="fairq," + "s" * 40)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--claims", type=int, default=1000)
    args = ap.parse_args()
    db = cp.create_db(args.dsn, "fairq_parse")
    dsn = cp.with_db(args.dsn, db)
    runs: dict[str, Run] = {"psycopg": through_psycopg, "positional": positional}
    try:
        print("| schema | bytes | psycopg us / claim | positional us / claim |")
        print("|---|---|---|---|")
        for schema in args.schemas.split(","):
            migrate.upgrade(dsn, schema)
            store = Store(dsn, schema, max_size=1)
            store.pool.wait()
            params = get_policy("weighted").claim_params(queue="default", batch=10, worker="w")
            for run in runs.values():
                for _ in range(100):
                    run(store, params)
            got: dict[str, list[float]] = {name: [] for name in runs}
            for r in range(args.rounds):
                for name in (list(runs) if r % 2 == 0 else list(reversed(runs))):
                    t0 = time.process_time()
                    for _ in range(args.claims):
                        runs[name](store, params)
                    got[name].append((time.process_time() - t0) / args.claims * 1e6)
            store.close()
            size = len(sql.statement("claim_fair", schema).encode())
            print(f"| {schema} | {size:,} | {statistics.median(got['psycopg']):.0f} | "
                  f"{statistics.median(got['positional']):.0f} |")
    finally:
        cp.drop_db(args.dsn, db)


if __name__ == "__main__":
    main()
