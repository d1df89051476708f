"""Run one scenario under one policy against a scratch schema and record what happened.

Two runners share the same measurements (``RunData``): fairq's policies run real ``Worker``
threads (each with its own pool, claiming concurrently); the lab's round robin runs
``lab/rr.sql`` exactly as written on its own schema (``lab/schema.sql``), one connection per
slot, because that statement claims and finishes one job per call. A side thread samples lock
waits from ``pg_stat_activity``/``pg_locks`` and, about once a second, the claim statement's
planning and execution time with ``EXPLAIN ANALYZE`` in a rolled-back transaction.
"""

from __future__ import annotations

import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql as pgsql

from benchmarks.scenarios import Scenario
from fairq.app import App
from fairq.job import Job
from fairq.models import ClaimedJob
from fairq.policies import get_policy
from fairq.runtime import Slots, StoreFactory, Worker, WorkerSettings, describe_error
from fairq.store.monitor import PARAM_TYPES, to_prepare

HERE = Path(__file__).resolve().parent
LAB = HERE / "lab"  # verbatim copies of the design's lab/rr.sql and lab/schema.sql
RR_POLICY = "rr_article"
TASK = "bench.work"
RETRY_DELAY_S = 0.2
SAMPLE_EVERY_S = 0.05
EXPLAIN_EVERY_S = 1.0
RR_IDLE_S = 0.05  # a slot that found nothing sleeps this long (rr.sql has no notification)


def _statements() -> dict[str, str]:
    text = (HERE / "bench.sql").read_text()
    out: dict[str, str] = {}
    for block in re.split(r"^-- name: ", text, flags=re.MULTILINE)[1:]:
        name, _, body = block.partition("\n")
        out[name.strip()] = "\n".join(
            line for line in body.splitlines() if not line.startswith("--")).strip()
    return out


SQL = _statements()


def rr_statement() -> str:
    """The lab's round-robin statement, byte for byte as written in ``lab/rr.sql``."""
    return (LAB / "rr.sql").read_text()


@dataclass
class RunData:
    """Raw observations of one run; ``metrics.summarise`` turns them into figures."""

    scenario: str
    policy: str
    expected: int
    released: float = 0.0  # DB epoch when workers were let go
    ended: float = 0.0
    completed: int = 0
    starts: list[tuple[str, float, float]] = field(default_factory=list)  # tenant, epoch, wait
    due: list[tuple[str, float]] = field(default_factory=list)  # tenant, epoch a job became due
    claim_s: list[float] = field(default_factory=list)
    empty_claims: int = 0
    plan_ms: list[float] = field(default_factory=list)
    exec_ms: list[float] = field(default_factory=list)
    lock_samples: list[tuple[int, int, int]] = field(default_factory=list)
    max_running: dict[str, int] = field(default_factory=dict)
    timed_out: bool = False
    notes: list[str] = field(default_factory=list)


class _Tracker:
    """Thread-safe counters the handlers update: starts, completions, concurrency per tenant."""

    def __init__(self, data: RunData) -> None:
        self.data = data
        self.lock = threading.Lock()
        self.running: dict[str, int] = {}
        self.all_done = threading.Event()

    def start(self, tenant: str, epoch: float, wait: float) -> None:
        with self.lock:
            self.data.starts.append((tenant, epoch, max(0.0, wait)))
            n = self.running.get(tenant, 0) + 1
            self.running[tenant] = n
            if n > self.data.max_running.get(tenant, 0):
                self.data.max_running[tenant] = n

    def end(self, tenant: str, ok: bool) -> None:
        with self.lock:
            self.running[tenant] -= 1
            if ok:
                self.data.completed += 1
                if self.data.completed >= self.data.expected:
                    self.all_done.set()


class _ClaimObserver:
    """Collects claim round-trip times and empty claims from fairq's worker hooks."""

    def __init__(self, data: RunData) -> None:
        self.data = data

    def on_enqueue(self, queue: str, tenant: str, count: int) -> None:
        pass

    def on_claim(self, queue: str, policy: str, result: str, seconds: float,
                 jobs: Any) -> None:
        self.data.claim_s.append(seconds)
        if result == "empty":
            self.data.empty_claims += 1

    def on_finish(self, job: ClaimedJob, outcome: str, run_seconds: float) -> None:
        pass

    def on_reap(self, queue: str, expired: int) -> None:
        pass

    def on_loop(self, healthy: bool) -> None:
        pass


class _BenchSlots(Slots):
    """Slots whose failed jobs retry after ``RETRY_DELAY_S`` instead of fairq's 20 s backoff,
    so the retry scenario fits in a benchmark run (the claim path is untouched)."""

    def execute(self, job: Job) -> None:
        task = self.tasks[job.task]
        t0 = time.monotonic()
        try:
            task.fn(job)
        except Exception as e:
            self.complete(job, describe_error(e), time.monotonic() - t0, RETRY_DELAY_S)
            return
        self.complete(job, None, time.monotonic() - t0)


class _BenchWorker(Worker):
    slots_class = _BenchSlots


def _bench_worker(app: App, **options: Any) -> Worker:
    """What ``app.worker(**options)`` builds, with ``_BenchSlots`` (the app's connection
    settings are fairq's defaults here)."""
    stores = StoreFactory(app.dsn, app.schema, pooler=app.pooler)
    return _BenchWorker(stores, app.tasks, WorkerSettings(**options), periodics=app.periodics)


def db_epoch(conn: psycopg.Connection[Any]) -> float:
    row = conn.execute(SQL["db_epoch"]).fetchone()
    assert row is not None
    return float(row[0])


@contextmanager
def _sampler(dsn: str, data: RunData, explain: Callable[[psycopg.Connection[Any]], None]
             ) -> Iterator[Callable[[], None]]:
    """Side thread: lock samples every 50 ms, one EXPLAIN ANALYZE sample a second."""
    stop = threading.Event()
    conn = psycopg.connect(dsn, autocommit=True)

    def sample_now() -> None:
        try:
            explain(conn)
        except psycopg.Error as exc:  # a timed-out sample is skipped, not fatal
            data.notes.append(f"explain sample skipped: {type(exc).__name__}")

    def sample_locks() -> None:
        row = conn.execute(SQL["lock_sample"]).fetchone()
        if row is not None:
            data.lock_samples.append((int(row[0]), int(row[1]), int(row[2])))

    def loop() -> None:
        next_explain = time.monotonic() + EXPLAIN_EVERY_S
        while not stop.wait(SAMPLE_EVERY_S):
            sample_locks()
            if time.monotonic() >= next_explain:
                sample_now()
                next_explain = time.monotonic() + EXPLAIN_EVERY_S

    thread = threading.Thread(target=loop, name="bench-sampler", daemon=True)

    def start() -> None:
        sample_now()  # one sample before release, while the whole backlog is queued
        sample_locks()  # and one lock sample, so a run shorter than the interval still has one
        thread.start()

    try:
        yield start
    finally:
        stop.set()
        if thread.ident is not None:
            thread.join(5)
        conn.close()


def _record_plan(data: RunData, row: tuple[Any, ...] | None) -> None:
    if not row:
        return
    plan = row[0][0] if isinstance(row[0], list) else row[0]
    data.plan_ms.append(float(plan["Planning Time"]))
    data.exec_ms.append(float(plan["Execution Time"]))


def _wait_until_done(tracker: _Tracker, deadline_s: float,
                     progress: Callable[[int], None] | None) -> bool:
    """Block until every expected job succeeded or the deadline; True if it timed out."""
    end = time.monotonic() + deadline_s
    while not tracker.all_done.wait(0.25):
        if progress is not None:
            progress(tracker.data.completed)
        if time.monotonic() >= end:
            return True
    if progress is not None:
        progress(tracker.data.completed)
    return False


def _producer(sc: Scenario, emit: Callable[[list[str]], None], stop: threading.Event) -> None:
    """Steady arrivals: ``rate`` jobs a second in ticks of 50 ms, tenants in turn."""
    if sc.arrivals is None:
        return
    tick = 0.05
    n_ticks = round(sc.arrivals.seconds / tick)
    per_tick = sc.arrivals.per_tick(tick)
    tenants = sc.arrivals.tenants
    k = 0
    t0 = time.monotonic()
    for i in range(n_ticks):
        if stop.is_set():
            return
        batch = [tenants[(k + j) % len(tenants)] for j in range(per_tick)]
        k += per_tick
        emit(batch)
        delay = t0 + (i + 1) * tick - time.monotonic()
        if delay > 0:
            stop.wait(delay)


# -- fairq ---------------------------------------------------------------------------------------
def run_fairq(dsn: str, sc: Scenario, policy_name: str, deadline_s: float,
              progress: Callable[[int], None] | None = None) -> RunData:
    policy = get_policy(policy_name)
    schema = f"bench_{secrets.token_hex(4)}"
    data = RunData(sc.name, policy_name, expected=sc.total_jobs())
    tracker = _Tracker(data)
    released: list[datetime] = []
    app = App(dsn, schema=schema, pool_size=2)
    try:
        app.migrate()
        if sc.weights or sc.caps:
            for tenant in sorted(set(sc.weights) | set(sc.caps)):
                app.tenants.set(tenant, weight=sc.weights.get(tenant),
                                max_running=sc.caps.get(tenant))

        def work(job: Job) -> None:
            wait = (job.started_at - max(job.run_at, released[0])).total_seconds()
            tracker.start(job.tenant, job.started_at.timestamp(), wait)
            ok = not (job.payload and job.payload.get("fail") and job.attempt == 1)
            try:
                if sc.job_seconds:
                    time.sleep(sc.job_seconds)
                if not ok:
                    raise RuntimeError("bench: first attempt fails by design")
            finally:
                tracker.end(job.tenant, ok)

        app.task(work, name=TASK, max_attempts=3)
        for delay, fail, tenants in sc.enqueue_groups():
            app.enqueue_many(TASK, [(t, {"fail": True} if fail else None) for t in tenants],
                             delay=delay or None)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(pgsql.SQL("ANALYZE {}.jobs").format(pgsql.Identifier(schema)))
            base = db_epoch(conn)
        data.due = [(t, base + d) for d, _, ts in sc.enqueue_groups() for t in ts]

        text, order = to_prepare(policy.statement, schema)
        prepared = f"bench_{policy.statement}"
        params = policy.claim_params(queue="default", batch=10, worker="bench-probe")

        def explain(conn: psycopg.Connection[Any]) -> None:
            if not getattr(conn, "_bench_prepared", False):
                types = pgsql.SQL(", ").join(pgsql.SQL(PARAM_TYPES.get(p, "unknown")) for p in order)
                conn.execute(pgsql.SQL("PREPARE {} ({}) AS ").format(
                    pgsql.Identifier(prepared), types) + pgsql.SQL(text))
                conn._bench_prepared = True  # type: ignore[attr-defined]
            stmt = pgsql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {}({})").format(
                pgsql.Identifier(prepared),
                pgsql.SQL(", ").join(pgsql.Literal(params[p]) for p in order))
            with conn.transaction(force_rollback=True):
                conn.execute("SET LOCAL statement_timeout = '2s'; SET LOCAL lock_timeout = '200ms'")
                _record_plan(data, conn.execute(stmt).fetchone())

        observer = _ClaimObserver(data)
        workers = [_bench_worker(app, concurrency=sc.slots, policy=policy_name, listen=False,
                                poll_interval=0.1, wake_interval=0.2, observer=observer,
                                grace_period=5.0, worker_id=f"bench-{i}")
                   for i in range(sc.workers)]
        stop_producer = threading.Event()

        def emit(batch: list[str]) -> None:
            app.enqueue_many(TASK, [(t, None) for t in batch])
            now = time.time()
            with tracker.lock:
                data.due.extend((t, now) for t in batch)

        with _sampler(dsn, data, explain) as start_sampler:
            start_sampler()
            with psycopg.connect(dsn, autocommit=True) as conn:
                data.released = db_epoch(conn)
                released.append(datetime.fromtimestamp(data.released).astimezone())
            threads = [threading.Thread(target=w.run, name=f"bench-worker-{i}", daemon=True)
                       for i, w in enumerate(workers)]
            producer = threading.Thread(target=_producer, args=(sc, emit, stop_producer),
                                        name="bench-producer", daemon=True)
            for t in threads:
                t.start()
            producer.start()
            data.timed_out = _wait_until_done(tracker, deadline_s, progress)
            data.ended = time.time()
            stop_producer.set()
            producer.join(10)
            for w in workers:
                w.stop()
            for t in threads:
                t.join(30)
        return data
    finally:
        app.close()
        drop_schema(dsn, schema)


# -- the lab's round robin (lab/rr.sql) -----------------------------------------------------------------
def _tenant_ids(sc: Scenario) -> dict[str, int]:
    names = sorted(sc.tenant_names())
    return {name: i + 1 for i, name in enumerate(names)}


def run_rr(dsn: str, sc: Scenario, deadline_s: float,
           progress: Callable[[int], None] | None = None) -> RunData:
    schema = f"rr_{secrets.token_hex(4)}"
    data = RunData(sc.name, RR_POLICY, expected=sc.total_jobs())
    tracker = _Tracker(data)
    ids = _tenant_ids(sc)
    names = {v: k for k, v in ids.items()}
    sdsn = psycopg.conninfo.make_conninfo(dsn, options=f"-c search_path={schema}")
    statement = rr_statement()
    if sc.caps:
        data.notes.append("rr.sql has no caps: they are not enforced")
    if sc.weights:
        data.notes.append("rr.sql has no weights: every tenant gets one turn")
    if sc.fail_share:
        data.notes.append("rr.sql marks a job done as it claims it: failures are not retried")
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(pgsql.SQL("CREATE SCHEMA {}").format(pgsql.Identifier(schema)))
    try:
        with psycopg.connect(sdsn, autocommit=True) as conn:
            conn.execute((LAB / "schema.sql").read_text())
            conn.execute(SQL["rr_insert_tenants"], {"tenants": list(ids.values())})
            for delay, _fail, tenants in sc.enqueue_groups():
                for start in range(0, len(tenants), 20_000):
                    chunk = tenants[start:start + 20_000]
                    conn.execute(SQL["rr_insert_jobs"], {"tenants": [ids[t] for t in chunk],
                                                         "delays": [delay] * len(chunk)})
            conn.execute("ANALYZE jobs; ANALYZE tenant_schedule")
            base = db_epoch(conn)
        data.due = [(t, base + d) for d, _, ts in sc.enqueue_groups() for t in ts]
        explain_sql = "EXPLAIN (ANALYZE, FORMAT JSON) " + statement.strip().rstrip(";")

        def explain(conn: psycopg.Connection[Any]) -> None:
            with conn.transaction(force_rollback=True):
                conn.execute(pgsql.SQL("SET LOCAL search_path = {}").format(
                    pgsql.Identifier(schema)))
                conn.execute("SET LOCAL statement_timeout = '2s'; SET LOCAL lock_timeout = '200ms'")
                _record_plan(data, conn.execute(explain_sql).fetchone())

        stop = threading.Event()

        def slot() -> None:
            with psycopg.connect(sdsn, autocommit=True) as conn:
                while not stop.is_set():
                    t0 = time.perf_counter()
                    row = conn.execute(statement).fetchone()
                    data.claim_s.append(time.perf_counter() - t0)
                    if row is None:
                        data.empty_claims += 1
                        stop.wait(RR_IDLE_S)
                        continue
                    tenant = names[int(row[1])]
                    tracker.start(tenant, 0.0, 0.0)  # times are read back from the table
                    if sc.job_seconds:
                        time.sleep(sc.job_seconds)
                    tracker.end(tenant, True)

        stop_producer = threading.Event()
        producer_conn = psycopg.connect(sdsn, autocommit=True)

        def emit(batch: list[str]) -> None:
            producer_conn.execute(SQL["rr_insert_jobs"], {"tenants": [ids[t] for t in batch],
                                                          "delays": [0.0] * len(batch)})
            now = time.time()
            with tracker.lock:
                data.due.extend((t, now) for t in batch)

        try:
            with _sampler(dsn, data, explain) as start_sampler:
                start_sampler()
                with psycopg.connect(dsn, autocommit=True) as conn:
                    data.released = db_epoch(conn)
                threads = [threading.Thread(target=slot, name=f"bench-rr-{i}", daemon=True)
                           for i in range(sc.workers * sc.slots)]
                producer = threading.Thread(target=_producer, args=(sc, emit, stop_producer),
                                            name="bench-producer", daemon=True)
                for t in threads:
                    t.start()
                producer.start()
                data.timed_out = _wait_until_done(tracker, deadline_s, progress)
                data.ended = time.time()
                stop_producer.set()
                producer.join(10)
                stop.set()
                for t in threads:
                    t.join(30)
        finally:
            producer_conn.close()
        with psycopg.connect(sdsn, autocommit=True) as conn:
            rows = conn.execute(SQL["rr_served"], {"released": data.released}).fetchall()
        data.starts = [(names[int(r[0])], float(r[1]), float(r[2])) for r in rows]
        return data
    finally:
        drop_schema(dsn, schema)


def drop_schema(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(pgsql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(pgsql.Identifier(schema)))


def run(dsn: str, sc: Scenario, policy: str, deadline_s: float,
        progress: Callable[[int], None] | None = None) -> RunData:
    """One scenario under one policy (``rr_article`` or a fairq policy name)."""
    if policy == RR_POLICY:
        return run_rr(dsn, sc, deadline_s, progress)
    return run_fairq(dsn, sc, policy, deadline_s, progress)
