"""Where a claim's CPU goes: per 1,000 jobs, the claimers' backends, the Python process, the machine.

    python -m benchmarks.claim_cpu [--tenants 1] [--policies fifo,weighted] [--repeats 10]
                                   [--variant NAME=FILE.sql ...] [--setup FILE.sql ...]
                                   [--vacuum-jobs SECONDS] [--uprobes]

claim_bench.py measures throughput; on a small, shared machine its ratios move by 0.1 from run to
run, too much to judge a change worth a few percent. This runs the same claim + finish rounds on
a private cluster (4 claimers, batch 10, the workers' ScheduleVacuum beside them), alternating
the policies, and reads CPU time from /proc around every round: the claimers' backends
(/proc/PID/schedstat, nanoseconds), this process, and the whole machine (/proc/stat). Figures
are medians over the rounds. ``--variant NAME=FILE.sql`` runs a candidate claim_fair (the statement text of
FILE, with ``{schema}`` and ``%(name)s`` placeholders like fairq/sql/claim.sql) as one more
policy with weighted's parameters, so a candidate and the current statement meet in the same
run; ``--variant NAME=FUNCTION[:POLICY]`` runs claim_fair's statement calling a candidate
function FUNCTION instead, with POLICY's parameters (weighted's unless named); ``--setup
FILE.sql`` creates what a candidate calls (a new engine function, say) first.
``--uprobes`` (root, Linux perf) also counts, per claim and finish, the backends' calls of
EvalPlanQualBegin (rows rechecked after a concurrent update) and ExecInitNode (plan nodes
started): counts, unlike times, do not depend on what else the machine is doing.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from benchmarks import claim_bench as cb
from benchmarks import claim_plans as cp
from fairq import policies, sql
from fairq.policies.base import Policy

HZ = os.sysconf("SC_CLK_TCK")
POSTGRES = "/usr/lib/postgresql/15/bin/postgres"
PROBES = ("EvalPlanQualBegin", "ExecInitNode")


def proc_cpu(pid: int) -> float:
    """CPU time of a process in clock ticks, from the scheduler's nanosecond count
    (/proc/PID/schedstat): utime + stime in /proc/PID/stat count whole ticks (10 ms), too coarse
    for a backend's few hundred ms in a round."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) * HZ / 1e9


def proc_faults(pid: int) -> int:
    """Minor page faults of a process: memory the kernel had to map (and zero) for it."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def machine_cpu() -> tuple[int, int]:
    """(busy, total) clock ticks of the whole machine since boot."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


def add_variant(spec: str) -> str:
    """Register a policy whose contended statement is a candidate: NAME=FILE.sql (FILE's text),
    or NAME=FUNCTION[:POLICY] (claim.sql's claim_fair statement calling FUNCTION, a candidate's
    function with claim_fair's parameters, in place of claim_fair; POLICY's values, weighted's
    unless named)."""
    name, _, target = spec.partition("=")
    if not name or not target:
        raise SystemExit(f"--variant takes NAME=FILE.sql or NAME=FUNCTION[:POLICY], not {spec!r}")
    statement = f"claim_fair_{name}"
    sql.names()  # load the packaged statements first
    if target.endswith(".sql"):
        text, base = Path(target).read_text().strip().rstrip(";"), policies.WEIGHTED
    else:
        fn, _, policy = target.partition(":")
        found = policies.POLICIES.get(policy or "weighted")
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", fn) or found is None \
                or "by_cost" not in dict(found.params):
            raise SystemExit(f"--variant {spec!r}: FUNCTION must be a lower-case name and POLICY "
                             "a fair policy (round_robin, weighted, drr)")
        call = "{schema}.claim_fair("
        if call not in sql._raw()["claim_fair"]:  # else the "candidate" would be claim_fair
            raise SystemExit(f"--variant {spec!r}: claim.sql's claim_fair no longer calls {call}")
        text = sql._raw()["claim_fair"].replace(call, "{schema}." + fn + "(")
        base = found
    sql._raw()[statement] = sql._compact(statement, text)
    policies.POLICIES[name] = Policy(name=name, statement=statement, waits=base.waits,
                                     params=base.params)
    return name


def probes_ready() -> bool:
    """Add the uprobes once; False (with a reason on stderr) where perf cannot."""
    if shutil.which("perf") is None or os.geteuid() != 0 or not Path(POSTGRES).exists():
        print("--uprobes needs root, perf and " + POSTGRES, file=sys.stderr)
        return False
    listed = subprocess.run(["perf", "probe", "-l"], capture_output=True, text=True).stdout
    for fn in PROBES:
        if f"probe_postgres:{fn} " not in listed:
            subprocess.run(["perf", "probe", "-x", POSTGRES, "--add", fn], capture_output=True)
    listed = subprocess.run(["perf", "probe", "-l"], capture_output=True, text=True).stdout
    return all(f"probe_postgres:{fn} " in listed for fn in PROBES)


def count_probes(stores: list[cb.CountingStore], pids: list[int], policy: str, queue: str,
                 jobs: int) -> dict[str, float]:
    """Probe hits per claim + finish of 10 jobs, over one round of ``policy``."""
    events = ",".join(f"probe_postgres:{fn}" for fn in PROBES)
    perf = subprocess.Popen(["perf", "stat", "-x,", "-e", events, "-p", ",".join(map(str, pids))],
                            stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)  # perf attaches
    got = cb.run_round(stores, policy, queue, jobs, 10).jobs
    perf.send_signal(signal.SIGINT)
    err = perf.communicate()[1]
    counts: dict[str, float] = {}
    for line in err.splitlines():
        parts = line.split(",")
        if len(parts) > 2 and parts[2].startswith("probe_postgres:") and parts[0].isdigit():
            counts[parts[2].split(":")[1]] = int(parts[0]) / got * 10
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--tenants", type=int, default=1)
    ap.add_argument("--policies", default="fifo,weighted")
    ap.add_argument("--variant", action="append", default=[],
                    metavar="NAME=FILE.sql|NAME=FUNCTION[:POLICY]")
    ap.add_argument("--setup", action="append", default=[], metavar="FILE.sql",
                    help="DDL run once after the schema is made ({schema}: its quoted name), "
                         "e.g. a candidate engine function a --variant calls")
    ap.add_argument("--vacuum-jobs", type=float, default=0.0, metavar="SECONDS",
                    help="also VACUUM jobs every SECONDS beside the claimers (0: never, as a "
                         "deployment between autovacuums): what the dead index entries at the "
                         "head of the queue cost")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--jobs-per-round", type=int, default=4000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--uprobes", action="store_true")
    ap.add_argument("--statements", action="store_true",
                    help="load pg_stat_statements (track = all, track_planning on) and print, "
                         "per policy, where its backends' execution time, planning and buffers "
                         "went, nested statements included")
    args = ap.parse_args(argv)
    pols = [p for p in args.policies.split(",") if p] + [add_variant(v) for v in args.variant]
    uprobes = args.uprobes and probes_ready()
    queue = f"q{args.tenants}"

    from tests.support import pgcluster

    options = {"fsync": "on", "synchronous_commit": "on", "shared_buffers": "128MB"}
    if args.statements:
        options |= {"shared_preload_libraries": "pg_stat_statements",
                    "pg_stat_statements.track": "all",
                    "pg_stat_statements.track_planning": "on"}
    cluster = pgcluster.start(Path(tempfile.mkdtemp(prefix="claim_cpu-")), options=options)
    spent: dict[str, list[tuple[str, int, float, int, float, int]]] = {}
    try:
        backlog = len(pols) * (args.repeats + 2) * args.jobs_per_round + 20 * args.tenants
        db = cb.load_size(cluster.dsn, args.tenants, backlog, 100_000)
        dsn = cp.with_db(cluster.dsn, db)
        run_setup(dsn, args.setup)
        rows: dict[str, list[tuple[float, ...]]] = {p: [] for p in pols}
        probes: dict[str, dict[str, float]] = {}
        with cb.claimers(dsn, args.workers, "auto") as stores, \
                cb.worker_maintenance(dsn, cb.DEFAULT_VACUUM_INTERVAL), \
                vacuuming_jobs(dsn, args.vacuum_jobs):
            pids = []
            for s in stores:
                with s.pool.connection() as conn:
                    row = conn.execute("SELECT pg_backend_pid()").fetchone()
                    assert row is not None
                    pids.append(int(row[0]))
            for p in pols:  # warm-up: prepared statements, plan caches
                cb.run_round(stores, p, queue, 300, 10)
            for rep in range(args.repeats):
                for p in pols[rep % len(pols):] + pols[:rep % len(pols)]:
                    if args.statements:
                        statements_reset(dsn)
                    b0, py0, m0 = sum(map(proc_cpu, pids)), time.process_time(), machine_cpu()
                    f0 = sum(map(proc_faults, pids))
                    r = cb.run_round(stores, p, queue, args.jobs_per_round, 10)
                    if args.statements and rep == args.repeats - 1:
                        spent[p] = statements_read(dsn, r.jobs)
                    b1, py1, m1 = sum(map(proc_cpu, pids)), time.process_time(), machine_cpu()
                    f1 = sum(map(proc_faults, pids))
                    per_k = 1000 / r.jobs
                    rows[p].append((r.rate, (b1 - b0) / HZ * 1000 * per_k,
                                    (py1 - py0) * 1000 * per_k, (m1[0] - m0[0]) / HZ * 1000 * per_k,
                                    1 - (m1[0] - m0[0]) / max(1, m1[1] - m0[1]),
                                    (f1 - f0) * per_k))
            if uprobes:
                for p in pols:
                    probes[p] = count_probes(stores, pids, p, queue, args.jobs_per_round)
    finally:
        cluster.stop()

    fifo_rate = statistics.median(r[0] for r in rows["fifo"]) if "fifo" in rows else None
    print(f"{args.tenants} tenant(s), {args.workers} claimers, batch 10, medians of "
          f"{args.repeats} rounds of {args.jobs_per_round} jobs; CPU in ms per 1,000 jobs\n")
    head = ("| policy | jobs/s | x fifo | backends | python | machine | machine idle "
            "| backends' page faults |")
    if uprobes:
        head += " rechecks started / claim+finish | plan nodes started / claim+finish |"
    print(head)
    print("|" + "---|" * head.count(" |"))
    for p in pols:
        med = [statistics.median(c) for c in zip(*rows[p], strict=True)]
        ratio = f"{med[0] / fifo_rate:.2f}" if fifo_rate else "-"
        line = (f"| {p} | {med[0]:.0f} | {ratio} | {med[1]:.0f} | {med[2]:.0f} | {med[3]:.0f} "
                f"| {med[4]:.2f} | {med[5]:.0f} |")
        if uprobes:
            pr = probes.get(p, {})
            line += f" {pr.get('EvalPlanQualBegin', float('nan')):.1f} |"
            line += f" {pr.get('ExecInitNode', float('nan')):.0f} |"
        print(line)
    for p, top in spent.items():
        print(f"\n{p}: execution time per 1,000 jobs by statement (last round; nested "
              "statements are inside their callers' time too)\n")
        print("| ms / 1,000 jobs | calls / 1,000 jobs | plans / 1,000 jobs | planning ms / 1,000 "
              "jobs | buffers / 1,000 jobs | statement |\n|---|---|---|---|---|---|")
        for text, calls, ms, plans, plan_ms, bufs in top:
            print(f"| {ms:.1f} | {calls:.0f} | {plans:.0f} | {plan_ms:.1f} | {bufs} | `{text}` |")
    return 0


@contextmanager
def vacuuming_jobs(dsn: str, every: float) -> Iterator[None]:
    """A thread that runs VACUUM on jobs every ``every`` seconds while the block runs."""
    if every <= 0:
        yield
        return
    import psycopg
    from psycopg import sql as pgsql

    stop = threading.Event()

    def loop() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            table = pgsql.Identifier(cp.SCHEMA, "jobs")
            while not stop.wait(every):
                conn.execute(pgsql.SQL("VACUUM {}").format(table))

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()


def run_setup(dsn: str, files: Sequence[str]) -> None:
    """Each FILE's DDL, ``{schema}`` replaced by the benchmark schema's quoted name."""
    import psycopg
    from psycopg import sql as pgsql

    with psycopg.connect(dsn, autocommit=True) as conn:
        quoted = pgsql.Identifier(cp.SCHEMA).as_string(conn)
        for f in files:
            conn.execute(Path(f).read_text().replace("{schema}", quoted).encode())


def statements_reset(dsn: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset()")


def statements_read(dsn: str, jobs: int) -> list[tuple[str, int, float, int, float, int]]:
    """The 15 statements with the most execution time, per 1,000 jobs: calls, execution ms,
    plans, planning ms (a nested statement replanned on every call shows here), shared buffers."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT regexp_replace(left(query, 90), '\\s+', ' ', 'g'), calls, total_exec_time, "
            "plans, total_plan_time, shared_blks_hit + shared_blks_read "
            "FROM pg_stat_statements WHERE query NOT LIKE '%%pg_stat_statements%%' "
            "ORDER BY total_exec_time DESC LIMIT 15").fetchall()
    return [(str(q).replace("|", "/"), int(c * 1000 / jobs), float(t) * 1000 / jobs,
             int(p * 1000 / jobs), float(pt) * 1000 / jobs, int(b * 1000 / jobs))
            for q, c, t, p, pt, b in rows]


if __name__ == "__main__":
    raise SystemExit(main())
