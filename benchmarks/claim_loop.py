"""One drain-matrix shape drained by one thread, no worker: where a claim's time goes, per policy.

    .venv/bin/python -m benchmarks.claim_loop [--shape singletons] [--scale 2.0] [--batch 8]
        [--policies fifo,weighted,fifo,weighted] [--vacuum-every 1.0] [--dsn URL]
    .venv/bin/python -m benchmarks.claim_loop --policies weighted@0012,weighted,...

drain_matrix.py measures the drain through real worker processes, where the claim, the finish,
the worker's threads and the machine all move the figure. This takes the worker away: for each
policy in turn (a fresh database each, statistics never analyzed, the shape enqueued as
drain_matrix.py enqueues it), one thread claims ``--batch`` jobs in an explicit transaction,
timing the statement and the commit apart, then finishes them, until a claim comes back empty.
``--vacuum-every S`` VACUUMs tenant_schedule every S seconds, as the worker's maintenance does
(0: never). It prints the median statement, commit and finish times, the WAL the drain wrote and
the CPU time its backends used per 1,000 jobs (from /proc, so the server must run on this
machine; CPU time moves less than wall time on a shared machine). ``NAME@REVISION`` migrates that
run's database only up to REVISION (an A/B of a migration that leaves the statements as they
are). Run policies more than once, alternating (the default): single runs on a shared machine
move.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import psycopg
from psycopg.rows import dict_row

from benchmarks import claim_cpu as cc
from benchmarks import drain_matrix as dm
from fairq import migrate, sql
from fairq.policies import get_policy
from tests.support.db import create_database, drop_database, dsn_for_db

ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def backend_cpu(conn: Any) -> dict[int, float]:
    """CPU seconds (user + system) of each backend connected to this database, from /proc."""
    pids = [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity "
                                       "WHERE datname = current_database()").fetchall()]
    out: dict[int, float] = {}
    for pid in pids:
        try:
            out[pid] = cc.proc_cpu(pid) / cc.HZ
        except OSError:  # the backend ended between the query and the read
            continue
    return out


def drain(dsn: str, policy: str, args: argparse.Namespace) -> dict[str, Any]:
    """Enqueue the shape, then claim and finish until empty; the medians in ms."""
    with dm.build_app(dsn) as a:
        a.tenants.apply({"defaults": {"weight": 1.0, "max_running": dm.DEFAULT_CAP}})
        plan = dm.make_plan(args.shape, args.scale)
        for tenant, cap in plan.caps.items():
            a.tenants.set(tenant, max_running=cap)
        a.enqueue_many(dm.TASK, dm.pre_items(plan))
        st, p = a.store, get_policy(policy)
        # In positional form, as the store sends it: psycopg converts a %(name)s text on every
        # execute when it is longer than the 4 KiB it caches (the fair claim statement of
        # migrations up to 0018 was: 0.09 ms a claim in this process, the fair policies' only).
        stmt = sql.positional(p.statement, dm.SCHEMA)
        with st.pool.connection() as conn:
            row = conn.execute("SELECT pg_current_wal_lsn()").fetchone()
            assert row is not None
            wal0 = row[0]
            cpu0 = backend_cpu(conn)
        execute: list[float] = []
        commit: list[float] = []
        finish: list[float] = []
        jobs = 0
        vacuumed = time.monotonic()
        started = time.perf_counter()
        while True:
            if args.vacuum_every > 0 and time.monotonic() - vacuumed >= args.vacuum_every:
                with st.pool.connection() as conn:  # the worker's own statement
                    conn.execute(st.statement("vacuum_tenant_schedule"))
                vacuumed = time.monotonic()
            params = p.claim_params(queue="default", batch=args.batch, worker="claim_loop")
            with st.pool.connection() as conn:
                t0 = time.perf_counter()
                with conn.transaction(), psycopg.RawCursor(conn, row_factory=dict_row) as cur:
                    cur.execute(stmt.text, stmt.values(params), prepare=True)
                    rows = cur.fetchall()
                    t1 = time.perf_counter()
                t2 = time.perf_counter()  # the block's end committed
            if not rows:
                break
            t3 = time.perf_counter()
            st.finish_done([(r["id"], r["attempts"]) for r in rows])
            finish.append(time.perf_counter() - t3)
            execute.append(t1 - t0)
            commit.append(t2 - t1)
            jobs += len(rows)
        seconds = time.perf_counter() - started
        with st.pool.connection() as conn:
            row = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (wal0,)).fetchone()
            assert row is not None
            wal = float(row[0])
            cpu = sum(v - cpu0.get(pid, 0.0) for pid, v in backend_cpu(conn).items())
    return {"jobs": jobs, "expected": plan.base_jobs, "seconds": seconds, "claims": len(execute),
            "statement_ms": statistics.median(execute) * 1e3,
            "commit_ms": statistics.median(commit) * 1e3,
            "finish_ms": statistics.median(finish) * 1e3, "wal_mb": wal / 1e6,
            "cpu_ms_per_1000": cpu * 1e3 / max(jobs, 1) * 1000}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dsn", default=ADMIN, help="admin DSN; each policy gets its own database")
    ap.add_argument("--shape", default="singletons", choices=sorted(dm.SHAPES))
    ap.add_argument("--scale", type=float, default=2.0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--policies", default="fifo,weighted,fifo,weighted")
    ap.add_argument("--vacuum-every", type=float, default=1.0, metavar="S")
    args = ap.parse_args()
    if dm.make_plan(args.shape, args.scale).extra:
        raise SystemExit(f"{args.shape}: its jobs arrive during the drain; only shapes enqueued "
                         "up front can be drained here")
    print(f"{args.shape} x {args.scale}, batch {args.batch}, VACUUM every {args.vacuum_every} s; "
          "medians per claim", flush=True)
    for spec in [p for p in args.policies.split(",") if p]:
        policy, _, revision = spec.partition("@")
        name = create_database(args.dsn, "fairq_claimloop")
        try:
            migrate.upgrade(dsn_for_db(args.dsn, name), dm.SCHEMA, revision or "head")
            r = drain(dsn_for_db(args.dsn, name), policy, args)
        finally:
            drop_database(args.dsn, name)
        print(f"{spec:16s} {r['jobs']}/{r['expected']} jobs in {r['claims']} claims, "
              f"{r['seconds']:.2f} s: statement {r['statement_ms']:.3f} ms, "
              f"commit {r['commit_ms']:.3f} ms, finish {r['finish_ms']:.3f} ms; "
              f"WAL {r['wal_mb']:.1f} MB; backends {r['cpu_ms_per_1000']:.0f} ms CPU "
              "per 1,000 jobs", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
