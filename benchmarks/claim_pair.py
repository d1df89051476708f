"""One claim's price per policy, paired: every policy claims in turn from its own copy of a shape.

    .venv/bin/python -m benchmarks.claim_pair [--shapes 1x8000,10x800,4000x2] [--batch 8]
        [--policies fifo,weighted,round_robin,drr] [--variant NAME=FILE.sql ...]
        [--setup FILE.sql ...] [--dsn URL]

claim_loop.py drains one database per policy, one after the other, and a shared machine moves
between them by more than a fair claim's premium over fifo's (a fifo drain against itself
differs by 10-20%). Here one database holds a copy of the shape per policy, each in its own
queue (``TENANTSxJOBS``: TENANTS tenants with JOBS queued jobs each, enqueued one job per
tenant in turn, no cap), and one thread claims ``--batch`` jobs for each policy in turn, in an
order rotated every round, sending the statement as the store does (``Store.claim``: one
round trip, committed), then finishes them. Every policy's claim N therefore runs within
milliseconds of every other's, on the same tables; the difference of each pair, policy minus
the first policy, is paired against the machine's drift. It prints, per policy, the median time
of a claim (send to rows fetched, commit included) and the median paired difference with its
95% interval (bootstrap of the median, 2,000 resamples). ``--variant NAME=FILE.sql`` adds a
policy whose claim is FILE's text (claim_fair's parameters, weighted's values; as in
claim_cpu.py), ``--variant NAME=FUNCTION[:POLICY]`` one whose claim is claim_fair's statement
calling FUNCTION instead (POLICY's values, weighted's unless named); ``--setup FILE.sql`` runs
FILE in each database after the migrations
(``{schema}`` = the schema), for a variant that calls a function of its own. tenant_schedule is
vacuumed every second, as the worker's maintenance does.
Statistics are never analyzed.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

import psycopg
from psycopg import sql as pgsql

from benchmarks import claim_cpu as cc
from benchmarks import drain_matrix as dm
from fairq import migrate
from fairq.policies import get_policy
from tests.support.db import create_database, drop_database, dsn_for_db

ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def parse_shape(text: str) -> tuple[int, int]:
    tenants, _, jobs = text.partition("x")
    try:
        t, j = int(tenants), int(jobs)
    except ValueError:
        raise SystemExit(f"--shapes takes TENANTSxJOBS items, not {text!r}") from None
    if t < 1 or j < 1:
        raise SystemExit(f"--shapes: {text!r} needs at least one tenant and one job")
    return t, j


def interval(diffs: list[float], rng: random.Random) -> tuple[float, float]:
    """95% bootstrap interval of the median of ``diffs``."""
    meds = sorted(statistics.median(rng.choices(diffs, k=len(diffs))) for _ in range(2000))
    return meds[50], meds[1949]


def run_shape(admin: str, shape: tuple[int, int], policies: list[str], batch: int,
              setup: list[str]) -> dict[str, list[float]]:
    """Claim times (s) per policy, claim by claim, until a claim comes back empty."""
    tenants, jobs = shape
    name = create_database(admin, "fairq_claimpair")
    try:
        dsn = dsn_for_db(admin, name)
        migrate.upgrade(dsn, dm.SCHEMA)
        with psycopg.connect(dsn, autocommit=True) as conn:
            quoted = pgsql.Identifier(dm.SCHEMA).as_string(conn)
            for f in setup:
                conn.execute(Path(f).read_text().replace("{schema}", quoted).encode())
        with dm.build_app(dsn) as a:
            a.tenants.apply({"defaults": {"weight": 1.0, "max_running": dm.DEFAULT_CAP}})
            items = [(f"t{k:05d}", {}) for _ in range(jobs) for k in range(tenants)]
            for i in range(len(policies)):
                a.enqueue_many(dm.TASK, items, queue=f"q{i}")
            st = a.store
            times: dict[str, list[float]] = {p: [] for p in policies}
            vacuumed = time.monotonic()
            rounds = 0
            while True:
                if time.monotonic() - vacuumed >= 1.0:
                    with st.pool.connection() as conn:
                        conn.execute(st.statement("vacuum_tenant_schedule"))
                    vacuumed = time.monotonic()
                k = rounds % len(policies)
                got: dict[str, list[tuple[int, int]]] = {}
                for i in list(range(k, len(policies))) + list(range(k)):
                    p = get_policy(policies[i])
                    t0 = time.perf_counter()
                    claimed = st.claim(p, queue=f"q{i}", batch=batch, worker="claim_pair")
                    times[policies[i]].append(time.perf_counter() - t0)
                    got[policies[i]] = [(j.id, j.attempts) for j in claimed]
                for done in got.values():
                    st.finish_done(done)
                if any(not done for done in got.values()):
                    # the shapes are the same: every policy is empty by now, or all but one
                    for ts in times.values():
                        del ts[-1]
                    return times
                rounds += 1
    finally:
        drop_database(admin, name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dsn", default=ADMIN, help="admin DSN; each shape gets its own database")
    ap.add_argument("--shapes", default="1x8000,10x800,4000x2")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--policies", default="fifo,weighted,round_robin,drr")
    ap.add_argument("--variant", action="append", default=[],
                    metavar="NAME=FILE.sql|NAME=FUNCTION[:POLICY]")
    ap.add_argument("--setup", action="append", default=[], metavar="FILE.sql")
    args = ap.parse_args()
    shapes = [parse_shape(s) for s in args.shapes.split(",") if s]
    policies = [p for p in args.policies.split(",") if p]
    policies += [cc.add_variant(v) for v in args.variant]
    for p in policies:
        get_policy(p)  # an unknown name fails here, before any database is made
    if len(set(policies)) != len(policies):
        raise SystemExit("--policies: each policy once (every one gets its own queue)")
    rng = random.Random(1)
    print(f"batch {args.batch}; claim = send to rows fetched, committed; "
          f"difference = paired against {policies[0]}, median [95% interval]", flush=True)
    for shape in shapes:
        times = run_shape(args.dsn, shape, policies, args.batch, args.setup)
        base = times[policies[0]]
        print(f"{shape[0]} tenant(s) x {shape[1]} jobs, {len(base)} claims each", flush=True)
        for p in policies:
            diffs = [x - y for x, y in zip(times[p], base, strict=True)]
            lo, hi = interval(diffs, rng) if p != policies[0] else (0.0, 0.0)
            print(f"  {p:14s} claim {statistics.median(times[p]) * 1e3:.3f} ms   "
                  f"difference {statistics.median(diffs) * 1e3:+.3f} ms "
                  f"[{lo * 1e3:+.3f}, {hi * 1e3:+.3f}]", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
