"""What a worker's poll of a queue with nothing due costs, per policy: statements and time.

    python -m benchmarks.claim_idle [--polls 2000] [--rounds 3]

A worker polls its queues when notified and every poll interval; most polls of a quiet queue
find nothing. The queue here holds one tenant whose only job is an hour away (an idle tenant
with a wake-up), as a quiet queue does. For each policy, in rounds that alternate the order:
statements per poll (claim_bench's CountingStore), wall ms per poll and the process's CPU ms per
poll, the medians over the rounds. To compare two commits, run it from each (the same machine,
one after the other, or alternating).
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks import claim_plans as cp
from benchmarks.claim_bench import CountingStore
from fairq import migrate
from fairq.models import NewJob
from fairq.policies import get_policy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", default=cp.DEFAULT_DSN,
                    help="admin DSN; a database is created there and dropped")
    ap.add_argument("--policies", default="fifo,round_robin,weighted,drr")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--polls", type=int, default=2000)
    args = ap.parse_args()
    db = cp.create_db(args.dsn, "fairq_idle")
    dsn = cp.with_db(args.dsn, db)
    try:
        migrate.upgrade(dsn, cp.SCHEMA)
        store = CountingStore(dsn, cp.SCHEMA, min_size=1, max_size=1)
        store.pool.wait()
        store.enqueue([NewJob("t", "later", "{}", delay=3600.0)])
        policies = args.policies.split(",")
        got: dict[str, dict[str, list[float]]] = {
            p: {"statements": [], "ms": [], "cpu_ms": []} for p in policies}
        for p in policies:  # warm-up: past psycopg's prepare threshold
            for _ in range(100):
                store.claim(get_policy(p), queue="default", batch=8, worker="w")
        for r in range(args.rounds):
            for p in (policies if r % 2 == 0 else list(reversed(policies))):
                pol = get_policy(p)
                sent, t0, c0 = store.used.total(), time.perf_counter(), time.process_time()
                for _ in range(args.polls):
                    if store.claim(pol, queue="default", batch=8, worker="w"):
                        raise SystemExit("a poll claimed a job: the queue is not idle")
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                got[p]["statements"].append((store.used.total() - sent) / args.polls)
                got[p]["ms"].append(wall / args.polls * 1000)
                got[p]["cpu_ms"].append(cpu / args.polls * 1000)
        store.close()
        print("| policy | statements / poll | ms / poll | client CPU ms / poll |")
        print("|---|---|---|---|")
        for p in policies:
            m = {k: statistics.median(v) for k, v in got[p].items()}
            print(f"| {p} | {m['statements']:.2f} | {m['ms']:.3f} | {m['cpu_ms']:.3f} |")
    finally:
        cp.drop_db(args.dsn, db)


if __name__ == "__main__":
    main()
