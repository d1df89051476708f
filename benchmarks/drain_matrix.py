"""End-to-end drain matrix: every policy on seven tenant shapes, real `fairq worker` processes.

    .venv/bin/python -m benchmarks.drain_matrix [--scale 1.0] [--repeats 1] \\
        [--shapes whale_first,whale_singletons,equal10,singletons,capped_whale,delayed_due,arrivals] \\
        [--policies fifo,round_robin,weighted,drr,time] [--concurrency 8] [--json PATH]

Quick check: ``.venv/bin/python -m benchmarks.drain_matrix --scale 0.2``.

Each (shape, policy, repeat) gets a FRESH database (migrated, nothing else), and nothing here ever
runs ANALYZE: the planner sees tables whose statistics were never gathered, as a new install
does before autovacuum's first analyze. Run it on a server with autovacuum off (the test server
is); every run checks ``pg_stats`` afterwards and reports ``analyzed`` if statistics appeared
anyway. Tenant defaults are weight 1 and ``max_running`` 100,000 (no cap) unless a shape says
otherwise. Handlers are no-ops (task ``noop``, defined in this module as ``app``).

Shapes (sizes times ``--scale``; the whale's jobs are always enqueued first):

1. ``whale_first``: tenant ``whale`` 5,000 jobs, then 100 tenants x 50 jobs.
2. ``whale_singletons``: whale 5,000, then 5,000 tenants x 1 job.
3. ``equal10``: 10 tenants x 2,000 jobs, interleaved.
4. ``singletons``: 10,000 tenants x 1 job.
5. ``capped_whale``: whale 5,000 with ``max_running`` 2 (``app.tenants.set``), then 100 x 50.
6. ``delayed_due``: whale 5,000, plus 1,000 tenants x 2 delayed jobs that fall due mid-run.
7. ``arrivals``: whale 5,000, plus 200 new tenants x 10 jobs enqueued mid-run in bursts of 5
   tenants (50 jobs) by a producer thread.

Timing of shapes 6 and 7: "mid-run" must mean mid-run at any scale and any drain speed, so the
extra load is scheduled from the run itself: the base load's drain rate, measured over 0.25 s
once 5% of it (at most 50 jobs) is done (the first claims are slow), gives its expected
remaining time R; the delayed jobs are then enqueued (one transaction, 20 groups of tenants)
with delays spread evenly over 0.1 R .. 0.3 R, and the producer's bursts are spread over
0.05 R .. 0.3 R (early: on a busy machine the rate measured can be a third of the real one).
A probe can be worse than that (341 jobs/s read where the worker drained 4,000 once), so the
producer also sends a burst at once when fewer than 200 jobs are queued: the worker
(``--until-empty``) must not run dry and end before the last burst (``early_bursts`` counts them).
Each run records how many extra jobs fell due (6) or arrived (7) before the whale's last
completion; where some did not, the run says "due after exit" or shows it in that count.

The worker is ``fairq worker benchmarks.drain_matrix:app --concurrency 8 --until-empty --policy P
--metrics-port PORT`` (the console script beside this Python). Measured per run:

* drain seconds: ``max(finished_at) - min(started_at)`` over all jobs (first claim to last
  completion, on the database clock; process start-up excluded); jobs/s = done jobs / that.
* job statuses after the worker exits. Every job must end ``done``. A worker that exits by
  itself while a job is still ``running``, or ``queued`` although it was due and committed
  before the worker decided to exit, left STRANDED jobs: the bug this benchmark exists to catch
  (reported loudly; the script exits 1). The decision's time is the worker's "nothing runnable"
  log line (else the exit seen by the harness), less 0.05 s; a job's commit time is the
  database clock read right after its enqueue committed (jobs enqueued before the worker
  started: always before). A job that became due or was committed only after that cutoff is
  counted apart (``due after exit``): the worker may have raced it legitimately, and the shape's
  timing did not hold (it still counts as undone).
* empty claims while work was claimable: every ``--sample-interval`` seconds (0.1) the sampler
  reads the worker's ``fairq_claim_seconds_count{result="empty"}`` (and ``result="claimed"``) from
  /metrics and counts claimable jobs in the database (up to 1,000; those of uncapped tenants,
  below, up to 200: the sampler needs "some" or "none"): queued, ``run_at <= now()``, and the
  tenant's real number of running jobs (from ``fairq.jobs``) below its ``max_running`` (from
  ``fairq.tenant_schedule``, else the default). Empty claims made in an interval with claimable
  jobs at both of its ends are "empty claims with work". A tenant held at a small cap (the capped
  whale: 2) goes between at-cap and below it many times an interval, and an empty claim while it
  is at its cap is no fault; so the table also gives, in brackets, the empty claims in intervals
  with "uncapped work" at both ends: due jobs of tenants whose cap exceeds the worker's
  concurrency, which one worker can never hold at their cap. ``stall`` is the longest stretch of
  intervals with claimable work at both ends, after the worker's first claim, in which no claim
  returned a job. Claims after the last sample are not seen. The worker runs with
  ``FAIRQ_METRICS_MAX_TENANTS=0`` (unless set): every tenant's series folded into one, so a scrape
  is a few KB.
* the worker's exit code, and its claims that failed (``result="error"``); the ratio of each
  fair policy's jobs/s to fifo's on the same shape.
* CPU per 1,000 jobs: the worker process's (its start-up included) and its server processes'
  (the connections named ``fairq-worker ...``, read from /proc at every sample while they live,
  so only where the server runs on this machine), and each policy's total against the fifo run
  of the same repeat (paired median). Time the machine's host steals (a shared virtual machine:
  21-28% of it on one morning, when drains took 2-3x as long as a few hours before) is not in a
  process's CPU time, but a contended host also makes the work itself slower: that morning, the
  runs of one cell that took longer also cost more CPU per job. So this is less noisy than the
  wall clock (fifo against itself: 0.91-1.05x where the wall clock gave 0.84-1.27x), not free of
  the noise. Informative; the target is the wall clock's.
* a worker that does not exit is stopped with SIGTERM after ``--timeout`` (300 s), or once no job
  finished and the claimable count stood still for ``--idle-timeout`` (30 s): reported as
  timeout / hung, a failure even when every job is done.

The sampler's query and scrape cost the machine a little CPU (a larger ``--sample-interval``
costs less); on a small or shared machine, run ``--repeats`` 3 or more before trusting a ratio.
With ``--repeats`` above 1 the table shows medians of seconds and jobs/s, and empty claims with
work summed over the repeats; next to the ratio of the medians, the median of each repeat's
ratio to its own fifo run (paired). ``--control`` runs fifo a second time in every (repeat,
shape) and reports it as ``fifo_control``: the spread between two runs of the same statement is
the machine's noise, the yardstick for a ratio near the target (the control is measured against
the first fifo run alone). The control is a fifo run too, so with it a fair policy is measured
against both: its ratio of medians against the median of all the shape's fifo runs, its paired
ratio against the geometric mean of the repeat's two, which the repeat's order (the control
always last, and fifo first unless ``--policies`` puts it elsewhere; reversed every other
repeat) puts on both sides of every fair run, so the machine's drift over a repeat cancels. With
three repeats or more the report also gives each cell the geometric mean of its paired ratios
with a 95% bootstrap interval over the repeats, and sorts the fair cells into below the target
beyond the noise (the whole interval under it), at or above it beyond the noise, and undecided
(an interval across 0.9x: this many repeats on this machine cannot call it either way).
Informative: the target is judged on the ratios of medians, as before. The target the project
aims at, reported against and not assumed: every fair policy >= 0.9x fifo on every shape, every
job done, zero empty claims while work is claimable. Exit status: 1 if any job was left undone
(or a worker failed or timed out), else 0.

``--statements`` runs the matrix on a private cluster of this machine's PostgreSQL 15 instead
(autovacuum off; fsync, synchronous_commit and full_page_writes on, as on the shared server) with
pg_stat_statements, reset after each run's enqueue: each cell also reports the server's
execution time per 1,000 jobs of the claim statement, of finish_done and of every top-level
statement in the run's database (the harness's sampler and, in shapes 6 and 7, its producer
included; nested statements are inside their caller's time). Wall-clock ratios on a shared
machine swing with its load; the server's time per job by statement says where a gap is. The
JSON (``--json``) also keeps each run's nested statements (those the engine's functions run),
the 15 with the most time: per 1,000 jobs, their time, calls and shared buffers.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import math
import os
import random
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import fairq

REPO = Path(__file__).resolve().parents[1]
SCHEMA = "fairq"
TASK = "noop"
DEFAULT_CAP = 100_000
POLICIES = ("fifo", "round_robin", "weighted", "drr", "time")
# --control: fifo once more in every (repeat, shape), reported as a policy of its own: how far
# two runs of the same statement land apart on this machine, against the target's 0.1.
CONTROL = "fifo_control"
TARGET_RATIO = 0.9
# paired_interval: bootstrap draws, and the fewest repeats it is given for.
INTERVAL_DRAWS = 4000
MIN_INTERVAL_REPEATS = 3
EXIT_MARGIN_S = 0.05


def build_app(dsn: str | None = None) -> fairq.App:
    """The benchmark's app: one no-op task (payload ``{"ms": M}``: it sleeps M ms).
    ``dsn=None``: ``$FAIRQ_DATABASE_URL`` (``--dsn``)."""
    a = fairq.App(dsn, schema=SCHEMA)

    @a.task(name=TASK, lease=30)
    def noop(job: fairq.Job) -> None:
        ms = job.payload.get("ms") if isinstance(job.payload, dict) else None
        if ms:  # benchmarks/scaling.py --job-ms: a handler that waits, as on I/O
            time.sleep(float(ms) / 1000)

    return a


# What `fairq worker benchmarks.drain_matrix:app` runs (fairq resolves the DSN on first use).
app = build_app()


# -- shapes ----------------------------------------------------------------------------------


@dataclass
class Plan:
    """One shape at one scale: what is enqueued before the worker starts, and what comes later."""

    pre: list[tuple[str, int]]  # (tenant, jobs) in enqueue order
    interleave: bool = False  # pre jobs round-robin over tenants instead of tenant by tenant
    caps: dict[str, int] = field(default_factory=dict)
    extra: str | None = None  # "delayed" or "arrivals"
    extra_tenants: int = 0
    extra_jobs_each: int = 0

    @property
    def base_jobs(self) -> int:
        return sum(n for _, n in self.pre)

    @property
    def total_jobs(self) -> int:
        return self.base_jobs + self.extra_tenants * self.extra_jobs_each


SHAPES: dict[str, str] = {
    "whale_first": "whale 5,000 first, then 100 tenants x 50",
    "whale_singletons": "whale 5,000 first, then 5,000 tenants x 1",
    "equal10": "10 tenants x 2,000, interleaved",
    "singletons": "10,000 tenants x 1",
    "capped_whale": "whale 5,000 (max_running 2) first, then 100 tenants x 50",
    "delayed_due": "whale 5,000; 1,000 tenants x 2 delayed jobs falling due mid-run",
    "arrivals": "whale 5,000; 200 tenants x 10 jobs arriving mid-run in bursts",
}


def make_plan(shape: str, scale: float) -> Plan:
    def n(x: float) -> int:
        return max(1, round(x * scale))

    def tenants(prefix: str, count: int, each: int) -> list[tuple[str, int]]:
        return [(f"{prefix}{i:05d}", each) for i in range(count)]

    whale = [("whale", n(5000))]
    if shape == "whale_first":
        return Plan(whale + tenants("t", n(100), 50))
    if shape == "whale_singletons":
        return Plan(whale + tenants("s", n(5000), 1))
    if shape == "equal10":
        return Plan(tenants("e", 10, n(2000)), interleave=True)
    if shape == "singletons":
        return Plan(tenants("s", n(10000), 1))
    if shape == "capped_whale":
        return Plan(whale + tenants("t", n(100), 50), caps={"whale": 2})
    if shape == "delayed_due":
        return Plan(whale, extra="delayed", extra_tenants=n(1000), extra_jobs_each=2)
    if shape == "arrivals":
        return Plan(whale, extra="arrivals", extra_tenants=n(200), extra_jobs_each=10)
    raise ValueError(f"unknown shape {shape!r}")


def pre_items(plan: Plan) -> list[tuple[str, Any]]:
    if not plan.interleave:
        return [(t, {}) for t, count in plan.pre for _ in range(count)]
    most = max(count for _, count in plan.pre)
    return [(t, {}) for i in range(most) for t, count in plan.pre if i < count]


# -- measuring -------------------------------------------------------------------------------

# The sampler's counts stop here: it only has to tell "some" from "none", and see a count move.
# (Counting every due job took 25 ms a sample with 20,000 queued: at ten samples a second, a
# quarter of a core on a two-core machine, more server time than the worker's claims.)
COUNT_CAP = 1000
UNCAPPED_CAP = 200

CLAIMABLE_SQL = f"""
-- Every running job has a lease (the claim sets locked_until, the finish clears it): read
-- through jobs_lease_idx, not the whole table.
WITH running AS (
    SELECT queue, tenant, count(*) AS n FROM {SCHEMA}.jobs
    WHERE status = 'running' AND locked_until IS NOT NULL GROUP BY 1, 2
),
-- A tenant is at its cap only if it runs something: its cap is looked up for those few. (Each
-- sample grouped the due jobs by tenant and looked up every such tenant's cap: 30,000 buffers
-- and 45 ms a sample with 10,000 one-job tenants, the heaviest statement on the server.)
at_cap AS MATERIALIZED (
    SELECT r.queue, r.tenant FROM running r
    LEFT JOIN {SCHEMA}.tenant_schedule s ON s.queue = r.queue AND s.tenant = r.tenant
    WHERE r.n >= coalesce(s.max_running, {DEFAULT_CAP})
),
-- Read twice, each time only as far as its LIMIT.
claimable AS NOT MATERIALIZED (
    SELECT j.queue, j.tenant FROM {SCHEMA}.jobs j
    WHERE j.status = 'queued' AND j.run_at <= now()
      AND NOT EXISTS (SELECT FROM at_cap a WHERE a.queue = j.queue AND a.tenant = j.tenant)
)
SELECT (SELECT count(*) FROM (SELECT FROM claimable LIMIT {COUNT_CAP}) c),
       -- progress, for --idle-timeout: the last finish, one read of jobs_finished_idx
       (SELECT extract(epoch FROM max(finished_at)) * 1e6 FROM {SCHEMA}.jobs
        WHERE status IN ('done', 'failed', 'cancelled'))::bigint,
       -- of tenants whose cap exceeds the worker's concurrency: never at their cap
       (SELECT count(*) FROM (
            SELECT FROM claimable c
            WHERE NOT EXISTS (SELECT FROM {SCHEMA}.tenant_schedule s
                              WHERE s.queue = c.queue AND s.tenant = c.tenant
                                AND s.max_running <= %(concurrency)s)
            LIMIT {UNCAPPED_CAP}) u)
"""

# The sampler's session: index scans that stop at the LIMIT, whatever the (never gathered)
# statistics say; no JIT for the inflated costs that forbidding the alternatives gives.
SAMPLER_SETTINGS = {"enable_seqscan": "off", "enable_bitmapscan": "off", "jit": "off"}


def sampler_session(conn: Any) -> None:
    """Give ``conn`` (autocommit) the sampler's planner settings, for the session."""
    for key, value in SAMPLER_SETTINGS.items():
        conn.execute("SELECT set_config(%s, %s, false)", (key, value))

# The same without the cap, should the engine's tables change under us (it is being rewritten).
CLAIMABLE_FALLBACK_SQL = f"""
SELECT count(*) FILTER (WHERE status = 'queued' AND run_at <= now()),
       count(*) FILTER (WHERE status NOT IN ('queued', 'running')),
       count(*) FILTER (WHERE status = 'queued' AND run_at <= now())
FROM {SCHEMA}.jobs
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# The worker's server processes: its connections, named after it (fairq-worker ...). Their CPU
# time is read from /proc while they live (they exit with the worker), so only where the server
# runs on this machine: its address is a loopback one, or a Unix socket (NULL).
BACKENDS_SQL = """
SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND application_name LIKE 'fairq-worker%'
"""
LOCAL_SERVER_SQL = "SELECT coalesce(host(inet_server_addr()) IN ('127.0.0.1', '::1'), true)"


def process_ticks(pid: int) -> int | None:
    """utime + stime of a postgres process on this machine, in clock ticks (None: gone)."""
    try:
        if not Path(f"/proc/{pid}/comm").read_text().startswith("postgres"):
            return None
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5)


def read_backend_cpu(conn: Any, ticks: dict[int, int]) -> None:
    """Record the current CPU ticks of the worker's server processes into ``ticks``: a process
    read last a sample interval before it exits is counted up to then (the worker's last
    moments, when it has stopped claiming)."""
    for (pid,) in conn.execute(BACKENDS_SQL).fetchall():
        t = process_ticks(int(pid))
        if t is not None:
            ticks[int(pid)] = max(t, ticks.get(int(pid), 0))


def scrape_claims(port: int) -> dict[str, float] | None:
    """``fairq_claim_seconds_count`` by result from the worker's /metrics; None if unreachable."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1.0) as r:
            text = r.read().decode()
    except (OSError, http.client.HTTPException):
        return None
    out = {"claimed": 0.0, "empty": 0.0, "error": 0.0}
    for line in text.splitlines():
        # fairq_claim_seconds_count{policy="fifo",queue="default",result="empty"} 3.0
        if line.startswith("fairq_claim_seconds_count{"):
            labels, _, value = line.rpartition(" ")
            result = labels.partition('result="')[2].partition('"')[0]
            out[result] = out.get(result, 0.0) + float(value)
    return out


def fairq_command() -> list[str]:
    script = Path(sys.executable).with_name("fairq")
    return [str(script)] if script.exists() else [sys.executable, "-m", "fairq"]


class ExtraLoad(threading.Thread):
    """Shapes 6 and 7: once the base load is draining, enqueue the delayed jobs or run the producer."""

    PROBE_S = 0.25  # over how long the base load's rate is taken
    DRY = 200  # queued jobs under which the next arrival burst comes at once (~50 ms of work)

    def __init__(self, dsn: str, plan: Plan, proc: subprocess.Popen[bytes]) -> None:
        super().__init__(daemon=True, name="extra-load")
        self.dsn, self.plan, self.proc = dsn, plan, proc
        self.info: dict[str, Any] = {}
        self.error: str | None = None
        # tenant -> database time by which its jobs were committed (an upper bound: read with
        # clock_timestamp() right after the commit returned)
        self.visible: dict[str, Any] = {}

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # reported with the run, never silently lost
            self.error = f"{type(exc).__name__}: {exc}"

    def _run(self) -> None:
        import psycopg

        with build_app(self.dsn) as a, psycopg.connect(self.dsn, autocommit=True) as conn:
            a.store.pool.wait()  # connected before the clock matters
            self._probe_and_load(a, conn)

    def _probe_and_load(self, a: fairq.App, conn: Any) -> None:
        plan = self.plan
        # The rate is taken between two points of the drain, the first once 5% of the base load
        # is done (or 50 jobs): the first claims are slow, a rate from them would put the
        # extra load after the end of the base load.
        first = max(1, min(50, plan.base_jobs // 20))
        marks: list[tuple[float, int]] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and self.proc.poll() is None:
            row = conn.execute(
                f"SELECT extract(epoch FROM clock_timestamp() - min(started_at))::float8, "
                f"count(*) FILTER (WHERE status = 'done') FROM {SCHEMA}.jobs").fetchone()
            assert row is not None
            if row[0] is not None:
                elapsed, done = float(row[0]), int(row[1])
                if not marks and done >= first:
                    marks.append((elapsed, done))
                elif marks and (elapsed - marks[0][0] >= self.PROBE_S
                                or done - marks[0][1] >= plan.base_jobs // 10):
                    marks.append((elapsed, done))
                    break
            time.sleep(0.01)
        rate = None
        done = marks[-1][1] if marks else 0
        if len(marks) == 2 and marks[1][1] > marks[0][1]:
            rate = (marks[1][1] - marks[0][1]) / (marks[1][0] - marks[0][0])
        remaining = (plan.base_jobs - done) / rate if rate else 1.0
        self.info.update(probe=[[round(t, 3), d] for t, d in marks],
                         rate_estimate=round(rate, 1) if rate else None,
                         base_remaining_estimate_s=round(remaining, 3))
        names = [f"{'d' if plan.extra == 'delayed' else 'a'}{i:05d}" for i in range(plan.extra_tenants)]
        if plan.extra == "delayed":
            self._delayed(a, names, remaining)
        else:
            self._arrivals(a, conn, names, remaining)

    def _delayed(self, a: fairq.App, names: list[str], remaining: float) -> None:
        import psycopg

        lo, hi = 0.1 * remaining, 0.3 * remaining
        groups = min(20, len(names))
        t0 = time.perf_counter()
        with psycopg.connect(self.dsn) as tx:  # one transaction: a delay counts from its now()
            for g in range(groups):
                delay = lo + (hi - lo) * g / max(1, groups - 1)
                items = [(t, {}) for t in names[g::groups] for _ in range(self.plan.extra_jobs_each)]
                a.enqueue_many(TASK, items, delay=delay, connection=tx)
            tx.commit()
            row = tx.execute("SELECT clock_timestamp()").fetchone()
        assert row is not None
        self.visible.update(dict.fromkeys(names, row[0]))
        self.info.update(delays_s=[round(lo, 3), round(hi, 3)],
                         enqueue_s=round(time.perf_counter() - t0, 3))

    def _arrivals(self, a: fairq.App, conn: Any, names: list[str], remaining: float) -> None:
        lo, hi = 0.05 * remaining, 0.3 * remaining
        per_burst = 5
        bursts = [names[i:i + per_burst] for i in range(0, len(names), per_burst)]
        start = time.perf_counter()
        late = 0.0
        early = 0  # bursts enqueued before their time: the queue was about to run dry
        for k, burst in enumerate(bursts):
            at = start + lo + (hi - lo) * k / max(1, len(bursts) - 1)
            now = time.perf_counter()
            if at <= now:
                late = max(late, now - at)
            # The window comes from a rate probed over a quarter second at the drain's start; a
            # slow start makes it too long, and a worker that drains the base load before the
            # last bursts rightly ends (--until-empty) with them still to come. So while waiting,
            # a queue down to its last few jobs gets the burst now.
            while now < at:
                row = conn.execute(f"SELECT count(*) < {self.DRY} FROM {SCHEMA}.jobs "
                                   f"WHERE status = 'queued'").fetchone()
                assert row is not None
                if row[0]:
                    early += 1
                    break
                time.sleep(min(0.02, at - now))
                now = time.perf_counter()
            a.enqueue_many(TASK, [(t, {}) for t in burst for _ in range(self.plan.extra_jobs_each)])
            row = conn.execute("SELECT clock_timestamp()").fetchone()
            assert row is not None
            self.visible.update(dict.fromkeys(burst, row[0]))
        self.info.update(window_s=[round(lo, 3), round(hi, 3)], bursts=len(bursts),
                         early_bursts=early, producer_s=round(time.perf_counter() - start, 3),
                         max_burst_lateness_s=round(late, 3))


def run_once(admin: str, shape: str, policy: str, args: argparse.Namespace) -> dict[str, Any]:
    """One (shape, policy) on a fresh database, dropped afterwards."""
    with tempfile.TemporaryFile() as logf:
        return _run_once(admin, shape, policy, args, logf)


def _run_once(admin: str, shape: str, policy: str, args: argparse.Namespace,
              logf: Any) -> dict[str, Any]:
    import psycopg

    from fairq import migrate
    from tests.support.db import create_database, drop_database, dsn_for_db

    plan = make_plan(shape, args.scale)
    name = create_database(admin, "fairq_drainmatrix")
    dsn = dsn_for_db(admin, name)
    proc: subprocess.Popen[bytes] | None = None
    res: dict[str, Any] = {"shape": shape, "policy": policy, "jobs": plan.total_jobs}
    try:
        migrate.upgrade(dsn, SCHEMA)
        with build_app(dsn) as a:
            a.tenants.apply({"defaults": {"weight": 1.0, "max_running": DEFAULT_CAP}})
            for tenant, cap in plan.caps.items():
                a.tenants.set(tenant, max_running=cap)
            a.enqueue_many(TASK, pre_items(plan))
        port = free_port()
        cmd = [*fairq_command(), "worker", "benchmarks.drain_matrix:app", "--dsn", dsn,
               "--concurrency", str(args.concurrency), "--until-empty",
               "--policy", "fifo" if policy == CONTROL else policy,
               "--metrics-port", str(port)]
        # All tenants' metric series folded into one: a scrape stays small (a few KB, not 90),
        # so sampling it ten times a second costs the worker little.
        env = {"FAIRQ_METRICS_MAX_TENANTS": "0", **os.environ}
        conn = psycopg.connect(dsn, autocommit=True)
        try:
            if args.statements:  # the drain's statements only, not the enqueue's
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                conn.execute("SELECT pg_stat_statements_reset()")
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=logf, stderr=subprocess.STDOUT)
            extra = ExtraLoad(dsn, plan, proc) if plan.extra else None
            if extra:
                extra.start()
            row = conn.execute(LOCAL_SERVER_SQL).fetchone()
            ticks: dict[int, int] | None = {} if row and row[0] else None
            samples, exit_at, stopped, fallback = sample_until_exit(conn, proc, port, args,
                                                                    ticks)
            res["server_cpu_s"] = (round(sum(ticks.values()) / os.sysconf("SC_CLK_TCK"), 3)
                                   if ticks else None)
            if extra:
                extra.join(timeout=120)
                res["extra"] = {**extra.info, **({"error": extra.error} if extra.error else {})}
            logf.seek(0)
            log = logf.read().decode(errors="replace")
            decided = exit_decision(log) if not stopped else None
            # A job committed within EXIT_MARGIN_S of the worker's decision may have raced it.
            cutoff = (decided or exit_at) - timedelta(seconds=EXIT_MARGIN_S)
            res["exit_decided_at"] = decided.isoformat() if decided else None
            res.update(account(conn, plan, cutoff, extra.visible if extra else {}))
            res["claimable_query"] = "fallback (no cap)" if fallback else "capped"
            if args.statements:
                res["statements"] = server_time(conn)
                res["nested"] = nested_time(conn, res.get("done") or 0)
        finally:
            conn.close()
        res["exit_code"] = proc.returncode
        res["stopped"] = stopped
        after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the worker, waited for
        res["worker_cpu_s"] = round(after.ru_utime + after.ru_stime
                                    - before.ru_utime - before.ru_stime, 3)
        res.update(claim_stats(samples))
        res["worker_log_tail"] = log.splitlines()[-15:]
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        drop_database(admin, name)
    return res


def sample_until_exit(conn: Any, proc: subprocess.Popen[bytes], port: int,
                      args: argparse.Namespace, backend_ticks: dict[int, int] | None = None,
                      ) -> tuple[list[dict[str, Any]], Any, str | None, bool]:
    """Sample (claim counters, claimable jobs) until the worker exits; return the samples, the
    database time the exit was seen at, why the worker was stopped (None: it exited by itself)
    and whether the fallback query ran. With ``backend_ticks``, also the worker's server
    processes' CPU ticks at each sample (read_backend_cpu)."""
    import psycopg

    samples: list[dict[str, Any]] = []
    deadline = time.monotonic() + args.timeout
    fallback = False
    stopped: str | None = None
    last_progress, progress_at = (-1, -1.0), time.monotonic()
    sampler_session(conn)
    while True:
        t = time.monotonic()
        claims = scrape_claims(port)
        try:
            row = (conn.execute(CLAIMABLE_FALLBACK_SQL) if fallback else
                   conn.execute(CLAIMABLE_SQL, {"concurrency": args.concurrency})).fetchone()
        except (psycopg.errors.UndefinedColumn, psycopg.errors.UndefinedTable):
            fallback = True
            row = conn.execute(CLAIMABLE_FALLBACK_SQL).fetchone()
        claimable, finished, uncapped = ((int(row[0]), int(row[1] or 0), int(row[2])) if row
                                         else (0, 0, 0))
        samples.append({"t": t, "claimable": claimable, "uncapped": uncapped, "claims": claims})
        if backend_ticks is not None:
            read_backend_cpu(conn, backend_ticks)
        progress = (finished, claimable)
        if progress != last_progress:
            last_progress, progress_at = progress, t
        left = args.sample_interval - (time.monotonic() - t)
        try:
            proc.wait(timeout=max(0.001, left))
            break
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if now > deadline:
            stopped = f"timeout ({args.timeout:.0f} s)"
        elif now - progress_at > args.idle_timeout:
            stopped = f"hung (nothing finished for {args.idle_timeout:.0f} s)"
        if stopped:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            break
    conn.execute("RESET ALL")
    exit_row = conn.execute("SELECT now()").fetchone()
    return samples, exit_row[0] if exit_row else None, stopped, fallback


EXIT_LOG = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*"
                      r"(nothing runnable and nothing running|none may be claimed)", re.M)


def exit_decision(log: str) -> datetime | None:
    """When the worker logged that it was drained (its clock, this machine's), if it did."""
    m = EXIT_LOG.search(log)
    if m is None:
        return None
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").astimezone()


def account(conn: Any, plan: Plan, cutoff: Any, visible: dict[str, Any]) -> dict[str, Any]:
    """Statuses; a queued job counts as left behind ("stranded") when it was due and committed
    before ``cutoff`` (the worker's decision to exit, less a margin), else as after the exit."""
    row = conn.execute(f"""
        WITH vis AS (
            SELECT * FROM unnest(%(tenants)s::text[], %(at)s::timestamptz[]) AS v(tenant, at)
        ), j AS (
            SELECT j.*, greatest(j.run_at, coalesce(v.at, '-infinity')) AS visible_at
            FROM {SCHEMA}.jobs j LEFT JOIN vis v ON v.tenant = j.tenant
        )
        SELECT count(*) FILTER (WHERE status = 'done'),
               count(*) FILTER (WHERE status = 'queued' AND visible_at < %(cutoff)s),
               count(*) FILTER (WHERE status = 'queued' AND visible_at >= %(cutoff)s),
               count(*) FILTER (WHERE status = 'running'),
               count(*) FILTER (WHERE status = 'failed'),
               count(*) FILTER (WHERE status = 'cancelled'),
               count(*),
               extract(epoch FROM max(finished_at) - min(started_at))::float8,
               max(finished_at) FILTER (WHERE tenant = 'whale'),
               max(visible_at) FILTER (WHERE status = 'queued' AND visible_at < %(cutoff)s)
        FROM j""", {"cutoff": cutoff, "tenants": list(visible),
                    "at": list(visible.values())}).fetchone()
    assert row is not None
    done, stranded_q, after_exit, running, failed, cancelled, total, seconds, whale_end, last = row
    out: dict[str, Any] = {
        "done": done, "enqueued": total, "queued_stranded": stranded_q,
        # how long before the cutoff the last of them was due and committed
        "stranded_margin_s": (cutoff - last).total_seconds() if last else None,
        "queued_after_exit": after_exit, "running_left": running, "failed": failed,
        "cancelled": cancelled, "undone": total - done,
        "all_done": total == done and total == plan.total_jobs,
        "seconds": seconds, "jobs_per_s": done / seconds if seconds else None,
    }
    if plan.extra and whale_end is not None:
        col = "run_at" if plan.extra == "delayed" else "created_at"
        mid = conn.execute(f"SELECT count(*) FILTER (WHERE {col} < %(end)s), count(*) "
                           f"FROM {SCHEMA}.jobs WHERE tenant <> 'whale'", {"end": whale_end}).fetchone()
        assert mid is not None
        out["extra_before_whale_end"] = f"{mid[0]}/{mid[1]}"
    stats = conn.execute("SELECT count(*) FROM pg_stats WHERE schemaname = %s", (SCHEMA,)).fetchone()
    out["analyzed"] = bool(stats and stats[0])
    return out


def claim_stats(samples: list[dict[str, Any]]) -> dict[str, Any]:
    empty_with_work = empty_with_uncapped = 0.0
    stall = longest = 0.0
    seen = [s for s in samples if s["claims"] is not None]
    for prev, cur in itertools.pairwise(samples):
        if prev["claims"] is None or cur["claims"] is None:
            stall = 0.0
            continue
        work = prev["claimable"] > 0 and cur["claimable"] > 0
        empties = cur["claims"]["empty"] - prev["claims"]["empty"]
        if work:
            empty_with_work += empties
        if prev["uncapped"] > 0 and cur["uncapped"] > 0:
            empty_with_uncapped += empties
        started = sum(prev["claims"].values()) > 0  # not the worker's start-up
        if work and started and cur["claims"]["claimed"] == prev["claims"]["claimed"]:
            stall += cur["t"] - prev["t"]
            longest = max(longest, stall)
        else:
            stall = 0.0
    last = seen[-1]["claims"] if seen else None
    return {
        "samples": len(samples), "scraped": len(seen),
        "empty_claims_with_work": round(empty_with_work) if seen else None,
        "empty_claims_with_uncapped_work": round(empty_with_uncapped) if seen else None,
        "empty_claims_total": round(last["empty"]) if last else None,
        "claims_with_jobs": round(last["claimed"]) if last else None,
        "claim_errors": round(last["error"]) if last else None,
        "longest_stall_s": round(longest, 3),
        # counted up to COUNT_CAP
        "max_claimable": max((s["claimable"] for s in samples), default=0),
    }


# -- reporting -------------------------------------------------------------------------------


# --statements: what the drain's server time went to, by the statements' leading comment
# (`-- fairq NAME`), nested statements left out (they are inside their caller's time).
STATEMENT_GROUPS = ("claim_fair", "claim_fifo", "finish_done")


def server_time(conn: Any) -> dict[str, float]:
    """Milliseconds of execution per statement group since the reset, this database only (the
    sampler's own statements, which have no fairq comment, fall into ``other``)."""
    rows = conn.execute(
        "SELECT query, total_exec_time FROM pg_stat_statements s "
        "JOIN pg_database d ON d.oid = s.dbid "
        "WHERE d.datname = current_database() AND s.toplevel").fetchall()
    out: dict[str, float] = {"all": 0.0}
    for query, ms in rows:
        name = next((g for g in STATEMENT_GROUPS if f"-- fairq {g}" in query), "other")
        out[name] = out.get(name, 0.0) + float(ms)
        out["all"] += float(ms)
    return {k: round(v, 1) for k, v in out.items()}


def nested_time(conn: Any, jobs: int, top: int = 15) -> list[dict[str, Any]]:
    """The nested statements with the most execution time since the reset, this database only:
    the engine functions' own statements (claim_settle's, wait_and_pick's...), which the top-level
    figures hold inside their callers' time. Per 1,000 jobs; the text's first 100 characters."""
    rows = conn.execute(
        "SELECT regexp_replace(query, '\\s+', ' ', 'g'), total_exec_time, calls, "
        "shared_blks_hit + shared_blks_read FROM pg_stat_statements s "
        "JOIN pg_database d ON d.oid = s.dbid "
        "WHERE d.datname = current_database() AND NOT s.toplevel "
        "ORDER BY total_exec_time DESC LIMIT %s", (top,)).fetchall()
    per_k = 1000 / max(jobs, 1)
    return [{"statement": str(q)[:100], "ms": round(float(ms) * per_k, 2),
             "calls": round(int(calls) * per_k, 1), "buffers": round(int(b) * per_k, 1)}
            for q, ms, calls, b in rows]


def statements_table(runs: list[dict[str, Any]], shapes: list[str], policies: list[str]) -> str:
    """Server execution time per 1,000 jobs, medians over the repeats (--statements)."""
    head = ["shape", "policy", "claim ms / 1,000 jobs", "finish ms / 1,000 jobs",
            "all statements ms / 1,000 jobs"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for shape in shapes:
        for policy in policies:
            rs = [r for r in runs if r["shape"] == shape and r["policy"] == policy
                  and r.get("statements") and r.get("done")]
            if not rs:
                continue

            def per_k(key: str, rs: list[dict[str, Any]] = rs) -> str:
                ms = statistics.median(1000 * r["statements"].get(key, 0.0) / r["done"] for r in rs)
                return f"{ms:.1f}"

            claim = "claim_fifo" if policy in ("fifo", CONTROL) else "claim_fair"
            lines.append(f"| {shape} | {policy} | {per_k(claim)} | {per_k('finish_done')} | "
                         f"{per_k('all')} |")
    return "\n".join(lines)


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def cpu_per_k(run: dict[str, Any], key: str) -> float | None:
    """CPU milliseconds per 1,000 jobs done of ``key`` (server_cpu_s or worker_cpu_s)."""
    done, cpu = run.get("done") or 0, run.get(key)
    return None if cpu is None or done <= 0 else 1e6 * cpu / done


def total_cpu_per_k(run: dict[str, Any]) -> float | None:
    """The worker's and its server processes' CPU milliseconds per 1,000 jobs done, only for a
    run that did every job (where the server's CPU could be read)."""
    server, worker = cpu_per_k(run, "server_cpu_s"), cpu_per_k(run, "worker_cpu_s")
    return None if server is None or worker is None or not run["all_done"] else server + worker


def done_rate(run: dict[str, Any]) -> float | None:
    """Jobs/s of a run that did every job (a rate over part of the jobs is no throughput)."""
    return (run.get("jobs_per_s") or None) if run["all_done"] else None


def paired_ratios(runs: list[dict[str, Any]], shape: str, policy: str,
                  base_by_rep: dict[Any, list[dict[str, Any]]],
                  value: Callable[[dict[str, Any]], float | None]) -> list[float]:
    """Per repeat, ``value`` of the policy's run / the geometric mean of ``value`` over the
    repeat's fifo runs (with ``--control`` two, one at each end of the repeat's order);
    repeats where the policy's run or every fifo run has no value are left out."""
    out = []
    for r in runs:
        if r["shape"] != shape or r["policy"] != policy or (v := value(r)) is None:
            continue
        base = [fv for f in base_by_rep.get(r.get("repeat"), []) if (fv := value(f))]
        if base:
            out.append(v / math.prod(base) ** (1 / len(base)))
    return out


def paired_median(runs: list[dict[str, Any]], shape: str, policy: str,
                  base_by_rep: dict[Any, list[dict[str, Any]]],
                  value: Callable[[dict[str, Any]], float | None]) -> float | None:
    """The median of ``paired_ratios``."""
    ratios = paired_ratios(runs, shape, policy, base_by_rep, value)
    return statistics.median(ratios) if ratios else None


def paired_interval(ratios: list[float], draws: int = INTERVAL_DRAWS
                    ) -> tuple[float, float, float] | None:
    """The geometric mean of the paired ratios and a 95% percentile-bootstrap interval for it
    (repeats drawn with replacement, a fixed seed: the same runs give the same report). It
    says whether a cell's gap to the target is larger than what the repeats' spread can
    explain: on a shared machine one run of a cell moves by as much as fifo against itself.
    A rough interval on few repeats (a bootstrap of five understates their spread a little),
    so the report calls it informative. None below ``MIN_INTERVAL_REPEATS`` repeats."""
    if len(ratios) < MIN_INTERVAL_REPEATS or any(x <= 0 for x in ratios):
        return None
    logs = [math.log(x) for x in ratios]
    rng = random.Random(0)
    means = sorted(statistics.fmean(rng.choices(logs, k=len(logs))) for _ in range(draws))
    lo, hi = means[int(0.025 * draws)], means[int(0.975 * draws) - 1]
    return math.exp(statistics.fmean(logs)), math.exp(lo), math.exp(hi)


def summarize(runs: list[dict[str, Any]], shapes: list[str], policies: list[str]) -> list[dict[str, Any]]:
    rows = []
    for shape in shapes:
        fifo_rate = None
        base_rates: list[float] = []
        for policy in policies:
            rs = [r for r in runs if r["shape"] == shape and r["policy"] == policy]
            if not rs:
                continue
            rates = [r["jobs_per_s"] for r in rs if r.get("jobs_per_s")]
            secs = [r["seconds"] for r in rs if r.get("seconds")]
            ewk = [r["empty_claims_with_work"] for r in rs]
            ewh = [r["empty_claims_with_uncapped_work"] for r in rs]
            row = {
                "shape": shape, "policy": policy, "jobs": rs[0]["jobs"], "repeats": len(rs),
                "seconds": statistics.median(secs) if secs else None,
                "jobs_per_s": statistics.median(rates) if rates else None,
                "all_done": all(r["all_done"] for r in rs),
                "undone": max(r["undone"] for r in rs),
                "left_due": max(r["queued_stranded"] for r in rs),
                "left_running": max(r["running_left"] for r in rs),
                "exited_with_work": any(not r["stopped"] and r["queued_stranded"] + r["running_left"]
                                        for r in rs),
                "after_exit": max(r["queued_after_exit"] for r in rs),
                "empty_claims_with_work": None if any(e is None for e in ewk) else sum(ewk),
                "empty_claims_with_uncapped_work": None if any(e is None for e in ewh) else sum(ewh),
                "longest_stall_s": max(r["longest_stall_s"] for r in rs),
                "exit_codes": sorted({r["exit_code"] for r in rs}),
                "stopped": sorted({r["stopped"] for r in rs if r["stopped"]}),
                "claim_errors": sum(r["claim_errors"] or 0 for r in rs),
                "analyzed": any(r["analyzed"] for r in rs),
                "server_cpu_ms_per_k": _median([cpu_per_k(r, "server_cpu_s") for r in rs]),
                "worker_cpu_ms_per_k": _median([cpu_per_k(r, "worker_cpu_s") for r in rs]),
            }
            if policy == "fifo":
                fifo_rate = row["jobs_per_s"]
            if policy in ("fifo", CONTROL):
                base_rates += rates
            rows.append(row)
        # A fair policy is measured against every fifo run of the shape: with --control, the
        # two of each repeat, which the repeat's order puts at both of its ends (the machine's
        # drift over a repeat cancels in their mean, and the baseline has twice the runs).
        # The control itself is measured against the first fifo run only: that is the noise.
        base_rate = statistics.median(base_rates) if base_rates else None
        fifo_ok = any(r["shape"] == shape and r["policy"] == "fifo" and r["all_done"] for r in rows)
        base_ok = fifo_ok and all(r["all_done"] for r in rows
                                  if r["shape"] == shape and r["policy"] == CONTROL)
        fifo_by_rep: dict[Any, list[dict[str, Any]]] = {}
        base_by_rep: dict[Any, list[dict[str, Any]]] = {}
        for r in runs:
            if r["shape"] == shape and r["policy"] in ("fifo", CONTROL):
                base_by_rep.setdefault(r["repeat"], []).append(r)
                if r["policy"] == "fifo":
                    fifo_by_rep.setdefault(r["repeat"], []).append(r)
        for row in rows:
            if row["shape"] == shape:
                fifo_run = row["policy"] in ("fifo", CONTROL)  # the fifo row: 1.0x
                by_rep = fifo_by_rep if fifo_run else base_by_rep
                # Each repeat's ratio to the fifo runs beside it, then their median: the
                # machine's drift between repeats cancels (the ratio of medians below does not).
                paired = paired_ratios(runs, shape, row["policy"], by_rep, done_rate)
                row["x_fifo_paired"] = statistics.median(paired) if paired else None
                row["x_fifo_interval"] = paired_interval(paired)
                # CPU per job, the worker's and its server processes', paired the same way:
                # what a policy costs, without the time a shared machine's host steals (which
                # stretches the wall clock; see the module's docstring).
                row["cpu_x_fifo_paired"] = paired_median(runs, shape, row["policy"],
                                                         by_rep, total_cpu_per_k)
                # A rate over part of the jobs is no throughput: no ratio unless both finished.
                rate, ok = (fifo_rate, fifo_ok) if fifo_run else (base_rate, base_ok)
                row["x_fifo"] = (row["jobs_per_s"] / rate
                                 if rate and ok and row["all_done"] and row["jobs_per_s"]
                                 else None)
    return rows


def done_cell(row: dict[str, Any]) -> str:
    if row["all_done"]:
        return "yes"
    parts = []
    if row["left_due"]:
        parts.append(f"{row['left_due']} queued+due")
    if row["left_running"]:
        parts.append(f"{row['left_running']} running")
    if row["after_exit"]:
        parts.append(f"{row['after_exit']} due after exit")
    cell = f"**NO**: {row['undone']} undone ({', '.join(parts)})"
    if row["exited_with_work"]:
        cell += ", worker EXITED with work left"
    return cell


def exit_cell(row: dict[str, Any]) -> str:
    cell = ", ".join(map(str, row["exit_codes"]))
    if row["stopped"]:
        cell += (" (" + "; ".join(row["stopped"])
                 + ": stopped by the harness, SIGTERM then SIGKILL after 15 s)")
    if row["claim_errors"]:
        cell += f", {row['claim_errors']} claim errors"
    return cell


def table(rows: list[dict[str, Any]]) -> str:
    def f(v: float | None, fmt: str) -> str:
        return "n/a" if v is None else format(v, fmt)

    lines = ["| shape | policy | jobs | seconds | jobs/s | x fifo | all done | "
             "empty claims with work (with uncapped work) | longest stall (s) | worker exit | "
             "CPU ms / 1,000 jobs: server + worker (x fifo, paired) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = "-" if r["policy"] == "fifo" else f(r["x_fifo"], ".2f") + ("x" if r["x_fifo"] else "")
        if r["policy"] != "fifo" and r["x_fifo"] is None:
            ratio = "n/a (undone)"
        elif r["policy"] != "fifo" and r["repeats"] > 1 and r.get("x_fifo_paired") is not None:
            ratio += f" (paired {r['x_fifo_paired']:.2f}x)"
        ewk = ("n/a" if r["empty_claims_with_work"] is None else
               f"{r['empty_claims_with_work']} ({r['empty_claims_with_uncapped_work']})")
        lines.append(
            f"| {r['shape']} | {r['policy']} | {r['jobs']:,} | {f(r['seconds'], '.2f')} | "
            f"{f(r['jobs_per_s'], ',.0f')} | {ratio} | {done_cell(r)} | {ewk} | "
            f"{r['longest_stall_s']:.2f} | {exit_cell(r)} | {cpu_cell(r)} |")
    return "\n".join(lines)


def cpu_cell(row: dict[str, Any]) -> str:
    server, worker = row.get("server_cpu_ms_per_k"), row.get("worker_cpu_ms_per_k")
    if server is None or worker is None:
        return "n/a"
    cell = f"{server:.0f} + {worker:.0f}"
    if row["policy"] != "fifo" and row.get("cpu_x_fifo_paired") is not None:
        cell += f" ({row['cpu_x_fifo_paired']:.2f}x)"
    return cell


def target_report(rows: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    fair = [r for r in rows if r["policy"] not in ("fifo", CONTROL)]
    control = [r for r in rows if r["policy"] == CONTROL and r["x_fifo"] is not None]
    slow = [r for r in fair if r["x_fifo"] is not None and r["x_fifo"] < TARGET_RATIO]
    no_ratio = [r for r in fair if r["x_fifo"] is None]
    undone = [r for r in rows if not r["all_done"]]
    # Judged on uncapped work: a sample cannot tell whether a small-capped tenant was at its
    # cap when a claim came back empty (then nothing was claimable), so those are only shown.
    empties = [r for r in rows if r["empty_claims_with_uncapped_work"]]
    capped_only = [r for r in rows
                   if r["empty_claims_with_work"] and not r["empty_claims_with_uncapped_work"]]
    unknown = [r for r in rows if r["empty_claims_with_uncapped_work"] is None]

    def names(rs: list[dict[str, Any]], extra: str = "") -> str:
        return ", ".join(f"{r['shape']}/{r['policy']}" + (f" ({r[extra]})" if extra else "")
                         for r in rs)

    def ratio_names(rs: list[dict[str, Any]]) -> str:
        return ", ".join(f"{r['shape']}/{r['policy']} {r['x_fifo']:.3f}x" for r in rs)

    out = ["Target: every fair policy >= 0.9x fifo on every shape, every job done, "
           "zero empty claims while work is claimable."]
    out.append("- fair >= 0.9x fifo: " + ("met" if not slow and not no_ratio else
                                           "NOT MET: " + (ratio_names(slow) or "-"))
               + (f"; no comparable figure (jobs left undone, or no fifo run) for: {names(no_ratio)}"
                  if no_ratio else ""))
    out.append("- every job done: " + ("met" if not undone else "NOT MET: " + names(undone, "undone")))
    out.append("- zero empty claims with uncapped work: "
               + ("met" if not empties else "NOT MET: " + ", ".join(
                   f"{r['shape']}/{r['policy']} ({r['empty_claims_with_work']}; with uncapped work "
                   f"{r['empty_claims_with_uncapped_work']})" for r in empties))
               + (f" (not measured for: {names(unknown)})" if unknown else "")
               + ("; not judged, only a small-capped tenant's jobs at both ends of the interval: "
                  + names(capped_only, "empty_claims_with_work") if capped_only else ""))
    if control:
        lo, hi = min(r["x_fifo"] for r in control), max(r["x_fifo"] for r in control)
        out.append(f"- noise: fifo run twice ({CONTROL}), its second run x its first: "
                   f"{lo:.2f}x .. {hi:.2f}x over the shapes"
                   + (f" (paired: {min(p):.2f}x .. {max(p):.2f}x)"
                      if (p := [r["x_fifo_paired"] for r in control
                                if r.get("x_fifo_paired") is not None]) else ""))
    judged = [r for r in fair if r.get("x_fifo_interval")]
    below = [r for r in judged if r["x_fifo_interval"][2] < TARGET_RATIO]
    if judged:
        def cells(rs: list[dict[str, Any]]) -> str:
            return ", ".join(f"{r['shape']}/{r['policy']} {r['x_fifo_interval'][0]:.2f}x "
                             f"[{r['x_fifo_interval'][1]:.2f}, {r['x_fifo_interval'][2]:.2f}]"
                             for r in rs) or "none"

        above = [r for r in judged if r["x_fifo_interval"][1] >= TARGET_RATIO]
        undecided = [r for r in judged if r not in below and r not in above]
        noise = [r for r in rows if r["policy"] == CONTROL and r.get("x_fifo_interval")]
        out.append(f"- the repeats' verdict (geometric mean of the paired ratios, 95% bootstrap "
                   f"interval): below {TARGET_RATIO}x beyond the noise: {cells(below)}; at or "
                   f"above it beyond the noise: {len(above)} of {len(judged)} fair cells; "
                   f"undecided at this noise: {cells(undecided)}"
                   + (f"; {CONTROL}: {cells(noise)}" if noise else "") + " (informative)")
    fair_cpu = [r["cpu_x_fifo_paired"] for r in fair if r.get("cpu_x_fifo_paired") is not None]
    control_cpu = [r["cpu_x_fifo_paired"] for r in rows
                   if r["policy"] == CONTROL and r.get("cpu_x_fifo_paired") is not None]
    if fair_cpu:
        out.append(f"- CPU per job (the worker's and its server processes'), fair x fifo, "
                   f"paired: {min(fair_cpu):.2f}x .. {max(fair_cpu):.2f}x over the cells"
                   + (f"; fifo x fifo: {min(control_cpu):.2f}x .. {max(control_cpu):.2f}x"
                      if control_cpu else "") + " (informative, not the target)")
    verdict = {"ratio_met": not slow and not no_ratio, "all_done_met": not undone,
               "no_empty_claims_met": not empties and not unknown,
               "ratio_below_beyond_noise": [f"{r['shape']}/{r['policy']}" for r in below]}
    return "\n".join(out), verdict


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dsn", default=os.environ.get("FAIRQ_TEST_DSN",
                                                   "postgresql://postgres@127.0.0.1:5432/postgres"),
                   help="admin DSN; each run creates and drops its own database there")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies every shape's sizes")
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated subset")
    p.add_argument("--policies", default=",".join(POLICIES), help="comma-separated subset")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--sample-interval", type=float, default=0.1, metavar="S")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S",
                   help="per run: SIGTERM the worker after this long (reported as a failure)")
    p.add_argument("--idle-timeout", type=float, default=30.0, metavar="S",
                   help="per run: SIGTERM the worker when no job finished and the claimable "
                        "count did not change for this long (reported as hung)")
    p.add_argument("--control", action="store_true",
                   help=f"run fifo a second time in every (repeat, shape), as {CONTROL}: the "
                        "machine's own spread between two runs of one statement")
    p.add_argument("--statements", action="store_true",
                   help="run on a private cluster (this machine's PostgreSQL 15, autovacuum off, "
                        "fsync and synchronous_commit on like the shared server) with "
                        "pg_stat_statements, and report each cell's server execution time per "
                        "1,000 jobs: claim, finish, all statements (--dsn is not used)")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args()
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    policies = [s.strip() for s in args.policies.split(",") if s.strip()]
    bad = [s for s in shapes if s not in SHAPES] + [x for x in policies if x not in POLICIES]
    if args.control and "fifo" in policies:
        policies.append(CONTROL)
    if bad or args.scale <= 0 or args.repeats < 1:
        p.error(f"unknown shape/policy {bad} (shapes: {', '.join(SHAPES)}; "
                f"policies: {', '.join(POLICIES)}), or bad --scale/--repeats")

    cluster = None
    if args.statements:
        from tests.support import pgcluster

        cluster = pgcluster.start(Path(tempfile.mkdtemp(prefix="drain_matrix-")), options={
            "shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "all",
            "autovacuum": "off", "fsync": "on", "synchronous_commit": "on",
            "full_page_writes": "on", "shared_buffers": "128MB", "max_connections": "100"})
        args.dsn = cluster.dsn
    try:
        return _main(args, shapes, policies)
    finally:
        if cluster is not None:
            cluster.stop()
            cluster.remove()


def _main(args: argparse.Namespace, shapes: list[str], policies: list[str]) -> int:
    import psycopg

    with psycopg.connect(args.dsn, autocommit=True) as c:
        server = c.execute("SELECT current_setting('autovacuum'), "
                           "current_setting('server_version')").fetchone()
    assert server is not None
    if server[0] != "off":
        print(f"WARNING: autovacuum is {server[0]} on this server: it may analyze the tables during a "
              "run (each run reports whether statistics appeared)", file=sys.stderr)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True, check=False).stdout.strip()
    if subprocess.run(["git", "status", "--porcelain", "--", "fairq", "alembic"], cwd=REPO,
                      capture_output=True, text=True, check=False).stdout.strip():
        commit += " + uncommitted changes in fairq/ or alembic/"
    runs: list[dict[str, Any]] = []
    for rep in range(args.repeats):
        for shape in shapes:
            order = policies if rep % 2 == 0 else list(reversed(policies))
            for policy in order:
                t0 = time.perf_counter()
                res = run_once(args.dsn, shape, policy, args)
                res["repeat"] = rep
                runs.append(res)
                rate = res["jobs_per_s"]
                print(f"{shape}/{policy} rep={rep}: {res['done']}/{res['jobs']} done, "
                      f"{res['seconds'] or math.nan:.2f} s, {rate or math.nan:,.0f} jobs/s, exit "
                      f"{res['exit_code']}, empty claims {res['empty_claims_total']} "
                      f"(with work {res['empty_claims_with_work']}), claim errors "
                      f"{res['claim_errors']}, stall {res['longest_stall_s']} s, worker CPU "
                      f"{res.get('worker_cpu_s', math.nan):.2f} s"
                      + (f", STOPPED: {res['stopped']}" if res["stopped"] else "")
                      + (f", extra {res['extra']}" if "extra" in res else "")
                      + (f", before whale end {res['extra_before_whale_end']}"
                         if "extra_before_whale_end" in res else "")
                      + f" [{time.perf_counter() - t0:.1f} s wall]", file=sys.stderr)
                if not res["all_done"]:
                    if res["stopped"]:
                        what = (f"the harness stopped the worker ({res['stopped']}; exit "
                                f"{res['exit_code']})")
                    else:
                        what = f"the worker EXITED by itself with code {res['exit_code']}"
                        if res["queued_stranded"] + res["running_left"]:
                            what += " while work remained (STRANDED jobs)"
                    print(f"FAILURE {shape}/{policy}: {what}; {res['undone']} of {res['jobs']} jobs "
                          f"not done: {res['queued_stranded']} queued and due before the exit, "
                          f"{res['running_left']} running, {res['queued_after_exit']} due or "
                          f"enqueued after the exit, {res['failed']} failed; worker log tail:\n  "
                          + "\n  ".join(res["worker_log_tail"]), file=sys.stderr)
                if res["analyzed"]:
                    print(f"WARNING {shape}/{policy}: pg_stats has statistics for schema {SCHEMA}: "
                          "something analyzed the tables during the run", file=sys.stderr)
    rows = summarize(runs, shapes, policies)
    report, verdict = target_report(rows)
    print(f"\nfairq drain matrix at {commit}, scale {args.scale}, concurrency {args.concurrency}, "
          f"repeats {args.repeats}, PostgreSQL {server[1]}, statistics never analyzed\n")
    print(table(rows))
    print()
    print(report)
    if args.statements:
        print("\nServer execution time per 1,000 jobs (pg_stat_statements on a private cluster, "
              "top-level statements, medians over the repeats):\n")
        print(statements_table(runs, shapes, policies))
    failed = [r for r in rows if not r["all_done"] or r["stopped"]
              or any(code != 0 for code in r["exit_codes"])]
    if failed:
        print(f"\nFAILURE: jobs left undone or worker failures in {len(failed)} of {len(rows)} "
              "(shape, policy) cells; see the FAILURE lines on stderr", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "commit": commit, "scale": args.scale, "concurrency": args.concurrency,
            "repeats": args.repeats, "server_version": server[1], "shapes": {s: SHAPES[s] for s in shapes},
            "rows": rows, "target": verdict, "runs": runs}, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
