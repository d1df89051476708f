"""Row writes on tenant_schedule per job: one-job tenants drained by one claimer, fifo vs weighted.

    .venv/bin/python -m benchmarks.schedule_writes [--tenants 2000] [--batch 8]

Each policy gets a fresh database (migrated to head) with ``--tenants`` tenants of one job each,
then claims and finishes until the queue is empty. The figure is the change of
``pg_stat_user_tables.n_tup_upd`` (and of its HOT part) for tenant_schedule between the end of
the enqueue and the end of the drain, per job: what a claim and a finish cost the schedule table.
Statistics reach pg_stat_user_tables when a backend flushes them (at most once a second), so the
store is closed and the reading waits 1.5 s.
"""

from __future__ import annotations

import argparse
import time
import uuid

import psycopg

from fairq import migrate
from fairq.models import NewJob
from fairq.policies import get_policy
from fairq.store import Store

ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
READ = "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'tenant_schedule'"


def writes(dsn: str) -> tuple[int, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(READ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def measure(admin: str, policy: str, tenants: int, batch: int) -> str:
    db = "fairq_writes_" + uuid.uuid4().hex[:8]
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {db}")
    dsn = psycopg.conninfo.make_conninfo(admin, dbname=db)
    try:
        migrate.upgrade(dsn, "fairq")
        store = Store(dsn, "fairq", max_size=2)
        store.set_tenants([], defaults=(1.0, 100_000))
        store.enqueue([NewJob("t", f"t{i:05d}", "{}") for i in range(tenants)])
        time.sleep(1.5)
        before = writes(dsn)
        done = claims = 0
        while got := store.claim(get_policy(policy), queue="default", batch=batch, worker="w"):
            claims += 1
            store.finish_done([(j.id, j.attempts) for j in got])
            done += len(got)
        store.close()
        time.sleep(1.5)
        after = writes(dsn)
        return (f"{policy}: {done} jobs in {claims} claims, tenant_schedule row writes per job "
                f"{(after[0] - before[0]) / done:.2f} (HOT {(after[1] - before[1]) / done:.2f})")
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {db} WITH (FORCE)")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--dsn", default=ADMIN, help="admin DSN; a database is made and dropped there")
    ap.add_argument("--tenants", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()
    for policy in ("fifo", "weighted"):
        print(measure(args.dsn, policy, args.tenants, args.batch))


if __name__ == "__main__":
    main()
