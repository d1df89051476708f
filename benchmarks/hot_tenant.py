"""One busy tenant: how often its claims and finishes wait for each other's locks.

    .venv/bin/python -m benchmarks.hot_tenant [--loops 32] [--seconds 10] [--tenants 1]
        [--policy weighted] [--dsn URL]

``--loops`` threads, each on its own connection, claim one job and finish it, over and over,
from a backlog of ``--tenants`` tenants (no cap in reach) kept topped up by a producer thread.
Meanwhile a sampler reads ``pg_stat_activity`` of the benchmark's database every 10 ms and counts
the active sessions and those waiting on a lock (``wait_event_type = 'Lock'``). It prints the
claim-and-finish pairs per second and the share of active samples that waited on a lock, by
wait event. With ``--tenants 100`` the same loops spread over 100 tenants: the comparison for
one tenant's row being written by every claim, finish and wake-up.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections import Counter

import psycopg

from benchmarks import drain_matrix as dm
from fairq.policies import get_policy
from tests.support.db import create_database, drop_database, dsn_for_db

ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def run(dsn: str, args: argparse.Namespace) -> dict[str, object]:
    tenants = [f"t{i}" for i in range(args.tenants)]
    with dm.build_app(dsn) as a:
        a.tenants.apply({"defaults": {"weight": 1.0, "max_running": 10_000}})
        a.enqueue_many(dm.TASK, [(tenants[i % len(tenants)], {}) for i in range(20_000)])
    stop = threading.Event()
    pairs = [0] * args.loops
    waits: Counter[str] = Counter()
    active = 0

    def loop(k: int) -> None:
        with dm.build_app(dsn) as a:
            st, p = a.store, get_policy(args.policy)
            while not stop.is_set():
                jobs = st.claim(p, queue="default", batch=1, worker=f"hot-{k}")
                if jobs:
                    st.finish_done([(j.id, j.attempts) for j in jobs])
                    pairs[k] += 1

    def producer() -> None:
        with dm.build_app(dsn) as a:
            while not stop.is_set():
                a.enqueue_many(dm.TASK, [(tenants[i % len(tenants)], {}) for i in range(200)])
                stop.wait(0.05)

    def sampler() -> None:
        nonlocal active
        with psycopg.connect(dsn, autocommit=True) as c:
            while not stop.is_set():
                for state, wtype, wevent in c.execute(
                        "SELECT state, wait_event_type, wait_event FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"):
                    if state == "active":
                        active += 1
                        if wtype == "Lock":
                            waits[f"Lock:{wevent}"] += 1
                stop.wait(0.01)

    threads = [threading.Thread(target=loop, args=(k,)) for k in range(args.loops)]
    threads += [threading.Thread(target=producer), threading.Thread(target=sampler)]
    for t in threads:
        t.start()
    time.sleep(args.seconds)
    stop.set()
    for t in threads:
        t.join()
    locked = sum(waits.values())
    return {"pairs_per_s": sum(pairs) / args.seconds, "active": active, "lock": locked,
            "share": locked / max(active, 1), "by_event": dict(waits)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", default=ADMIN, help="admin DSN; the run gets its own database")
    ap.add_argument("--loops", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--tenants", type=int, default=1)
    ap.add_argument("--policy", default="weighted")
    args = ap.parse_args()
    from fairq import migrate

    name = create_database(args.dsn, "fairq_hot")
    try:
        dsn = dsn_for_db(args.dsn, name)
        migrate.upgrade(dsn, dm.SCHEMA)
        r = run(dsn, args)
    finally:
        drop_database(args.dsn, name)
    print(f"{args.loops} claim/finish loops over {args.tenants} tenant(s), {args.policy}, "
          f"{args.seconds:.0f} s: {r['pairs_per_s']:.0f} pairs/s; {r['lock']} of {r['active']} "
          f"active samples waited on a lock ({100 * float(r['share']):.1f}%) {r['by_event']}")


if __name__ == "__main__":
    main()
