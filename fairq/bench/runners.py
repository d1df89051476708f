"""Run one scenario under one policy against a scratch schema and record what happened.

fairq's policies run real ``Worker`` threads (each with its own pool, claiming concurrently);
``rr_article`` is the lab's round robin, run by ``rr.run_rr``. Both record a ``RunData``.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql as pgsql

from fairq.app import App
from fairq.bench.options import RR_POLICY
from fairq.bench.recording import (
    RunData,
    Tracker,
    db_epoch,
    drop_schema,
    producer,
    record_plan,
    sampler,
    wait_until_done,
)
from fairq.bench.rr import run_rr
from fairq.bench.scenarios import Scenario
from fairq.job import Job
from fairq.models import ClaimedJob
from fairq.policies import get_policy
from fairq.runtime import Slots, StoreFactory, Worker, WorkerSettings, describe_error
from fairq.store.monitor import PARAM_TYPES, to_prepare

__all__ = ["RR_POLICY", "run", "run_fairq"]

TASK = "bench.work"
RETRY_DELAY_S = 0.2


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

    def on_reap(self, queue: str, expired: int, failed: int = 0) -> None:
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


def run_fairq(dsn: str, sc: Scenario, policy_name: str, deadline_s: float,
              progress: Callable[[int], None] | None = None) -> RunData:
    policy = get_policy(policy_name)
    schema = f"bench_{secrets.token_hex(4)}"
    data = RunData(sc.name, policy_name, expected=sc.total_jobs())
    tracker = Tracker(data)
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
                record_plan(data, conn.execute(stmt).fetchone())

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

        with sampler(dsn, data, explain) as start_sampler:
            start_sampler()
            with psycopg.connect(dsn, autocommit=True) as conn:
                data.released = db_epoch(conn)
                released.append(datetime.fromtimestamp(data.released).astimezone())
            threads = [threading.Thread(target=w.run, name=f"bench-worker-{i}", daemon=True)
                       for i, w in enumerate(workers)]
            feeder = threading.Thread(target=producer, args=(sc, emit, stop_producer),
                                        name="bench-producer", daemon=True)
            for t in threads:
                t.start()
            feeder.start()
            data.timed_out = wait_until_done(tracker, deadline_s, progress)
            data.ended = time.time()
            stop_producer.set()
            feeder.join(10)
            for w in workers:
                w.stop()
            for t in threads:
                t.join(30)
        return data
    finally:
        app.close()
        drop_schema(dsn, schema)


def run(dsn: str, sc: Scenario, policy: str, deadline_s: float,
        progress: Callable[[int], None] | None = None) -> RunData:
    """One scenario under one policy (``rr_article`` or a fairq policy name)."""
    if policy == RR_POLICY:
        return run_rr(dsn, sc, deadline_s, progress)
    return run_fairq(dsn, sc, policy, deadline_s, progress)
