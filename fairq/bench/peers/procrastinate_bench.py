"""Procrastinate peer benchmark: schema install, batch defer, drain, noisy neighbour.

A tenant maps to a Procrastinate queue (``tenant_<n>``). Procrastinate has no per-queue
concurrency cap; its closest fairness knob is the job ``lock`` (one running job per lock,
in id order), exposed here as ``lock_per_tenant``.

CLI: ``python -m fairq.bench.peers.procrastinate_bench [--dsn DSN] [--jobs N]`` prints one
JSON line. Without ``--dsn`` it runs against a fresh random database that it drops afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import time
from collections.abc import Sequence
from typing import Any

from fairq.bench.peers import _harness as h

PEER = "procrastinate"
TASK_NAME = "fairq_peer_noop"
WORKER_ENTRY = "fairq.bench.peers.procrastinate_bench:worker_main"
# Procrastinate's worker defaults: one process, concurrency 1 (worker.WORKER_CONCURRENCY).
DEFAULTS: dict[str, int] = {"processes": 1, "concurrency": 1}
# (processes, concurrency) pairs tried to find the tuned figure.
TUNE_CANDIDATES: tuple[tuple[int, int], ...] = ((1, 8), (1, 32), (2, 8), (2, 32))
DONE_SQL = (
    "SELECT NOT EXISTS (SELECT 1 FROM procrastinate_jobs WHERE status IN ('todo', 'doing'))"
)


def tenant_queue(tenant: int) -> str:
    """Queue name that stands for ``tenant``."""
    return f"tenant_{tenant}"


def make_app(dsn: str, pool_max: int | None = None, side_pool: Any = None,
             job_seconds: float = 0.0) -> Any:
    """Build a Procrastinate ``App`` with the benchmark's no-op task registered.

    ``pool_max`` sizes the connector's pool (None keeps Procrastinate's default). With
    ``side_pool`` the task stamps its start into ``peer_noisy_jobs`` before sleeping
    ``job_seconds``.
    """
    from procrastinate import App, JobContext, PsycopgConnector

    pool_kwargs: dict[str, Any] = {}
    if pool_max is not None:
        pool_kwargs = {"min_size": 1, "max_size": pool_max}
    app = App(connector=PsycopgConnector(conninfo=dsn, **pool_kwargs))

    @app.task(name=TASK_NAME, pass_context=True)  # type: ignore[untyped-decorator, unused-ignore]
    async def noop(context: JobContext) -> None:
        if side_pool is not None:
            async with side_pool.connection() as conn:
                await conn.execute(h.NOISY_START_SQL_PSYCOPG, (context.job.id,))
        if job_seconds:
            await asyncio.sleep(job_seconds)

    return app


def install(dsn: str) -> dict[str, Any]:
    """Apply Procrastinate's schema with its own ``SchemaManager``."""

    async def run() -> None:
        app = make_app(dsn)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    t0 = time.perf_counter()
    asyncio.run(run())
    return {
        "peer": PEER,
        "version": importlib.metadata.version("procrastinate"),
        "install_s": time.perf_counter() - t0,
    }


def reset(dsn: str) -> None:
    """Empty Procrastinate's jobs, events and workers and drop the noisy side table."""
    h.execute(
        dsn,
        "TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_workers"
        " RESTART IDENTITY CASCADE",
        "DROP TABLE IF EXISTS peer_noisy_jobs",
    )


async def _defer(
    dsn: str, plan: Sequence[tuple[int, int]], chunk_size: int, lock: bool
) -> float:
    """Defer (tenant, count) groups in order with ``batch_defer_async``; return seconds."""
    app = make_app(dsn)
    async with app.open_async():
        task = app.tasks[TASK_NAME]
        t0 = time.perf_counter()
        for tenant, count in plan:
            name = tenant_queue(tenant)
            deferrer = task.configure(queue=name, lock=name if lock else None)
            for start in range(0, count, chunk_size):
                k = min(chunk_size, count - start)
                await deferrer.batch_defer_async(*({} for _ in range(k)))
        return time.perf_counter() - t0


def _spread(n_jobs: int, tenants: int) -> list[tuple[int, int]]:
    base, extra = divmod(n_jobs, tenants)
    return [(t, base + (1 if t <= extra else 0)) for t in range(1, tenants + 1)]


def enqueue(dsn: str, n_jobs: int, tenants: int = 1, chunk_size: int = 10_000) -> dict[str, Any]:
    """Batch-defer ``n_jobs`` no-op jobs over ``tenants`` queues; measure jobs/s.

    Uses ``JobDeferrer.batch_defer_async`` (one multi-row insert per chunk and tenant).
    """
    seconds = asyncio.run(_defer(dsn, _spread(n_jobs, tenants), chunk_size, lock=False))
    return {
        "peer": PEER,
        "jobs": n_jobs,
        "tenants": tenants,
        "chunk_size": chunk_size,
        "seconds": seconds,
        "jobs_per_s": n_jobs / seconds if seconds else None,
    }


def drain(
    dsn: str,
    n_jobs: int,
    processes: int = DEFAULTS["processes"],
    concurrency: int = DEFAULTS["concurrency"],
    tenants: int = 1,
    timeout_s: float = 600.0,
) -> dict[str, Any]:
    """Defer ``n_jobs`` no-op jobs, then drain them with ``processes`` x ``concurrency``.

    Workers run in until-empty mode (``wait=False``). Timing starts when the ready workers are
    released and ends at the last ``succeeded`` event (DB clock); ``wall_s`` is the same span
    seen by polling the jobs table.
    """
    reset(dsn)
    prefill = enqueue(dsn, n_jobs, tenants)
    h.execute(dsn, "ANALYZE procrastinate_jobs")
    # Default run keeps Procrastinate's default pool; tuned runs size it for the concurrency.
    pool_max = None if concurrency == DEFAULTS["concurrency"] else concurrency + 2
    cfg = {"dsn": dsn, "concurrency": concurrency, "pool_max": pool_max}
    with h.WorkerPool(WORKER_ENTRY, [cfg] * processes) as pool:
        spawn_s = pool.start()
        t0_db = h.db_epoch(dsn)
        pool.go()
        wall_s = h.wait_until(dsn, DONE_SQL, timeout_s, pool)
        pool.wait_exit(60)
        pool.check_alive_or_clean()
        pids = pool.pids
    done = int(h.fetch_value(dsn, "SELECT count(*) FROM procrastinate_jobs"
                                  " WHERE status = 'succeeded'"))
    end_db = h.fetch_value(
        dsn,
        "SELECT EXTRACT(EPOCH FROM max(at)) FROM procrastinate_events WHERE type = 'succeeded'",
    )
    seconds = float(end_db) - t0_db if end_db is not None else wall_s
    return {
        "peer": PEER,
        "jobs": n_jobs,
        "done": done,
        "processes": processes,
        "concurrency": concurrency,
        "pool_max": pool_max,
        "tenants": tenants,
        "spawn_s": spawn_s,
        "seconds": seconds,
        "wall_s": wall_s,
        "jobs_per_s": n_jobs / seconds if seconds > 0 else None,
        "prefill_jobs_per_s": prefill["jobs_per_s"],
        "worker_pids": pids,
    }


def drain_tuned(
    dsn: str,
    n_jobs: int,
    candidates: Sequence[tuple[int, int]] = TUNE_CANDIDATES,
) -> dict[str, Any]:
    """Drain once per (processes, concurrency) candidate; return the best run and all runs."""
    runs = [drain(dsn, n_jobs, processes=p, concurrency=c) for p, c in candidates]
    best = max(runs, key=lambda r: r["jobs_per_s"] or 0.0)
    return {**best, "candidates": [
        {k: r[k] for k in ("processes", "concurrency", "jobs_per_s")} for r in runs
    ]}


def noisy_neighbour(
    dsn: str,
    slots: int = 8,
    big_jobs: int = 1000,
    small_tenants: int = 10,
    small_jobs: int = 5,
    job_seconds: float = 0.01,
    lock_per_tenant: bool = False,
    poll_interval_s: float | None = None,
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """Tenant 1 defers ``big_jobs``, then tenants 2.. defer ``small_jobs`` each.

    One worker with concurrency ``slots`` drains every queue; each task stamps its start with
    the DB clock, then sleeps ``job_seconds``. With ``lock_per_tenant`` every job carries its
    tenant's lock. Enqueue time is the job's ``deferred`` event.

    The worker runs continuously (``wait=True``: in until-empty mode it would stop as soon as
    every remaining job is behind a held lock) and is stopped once all jobs are done. A lock
    release sends no notification, so a worker that found only locked jobs sleeps for
    ``fetch_job_polling_interval`` (5 s by default); ``poll_interval_s`` overrides it and
    defaults to 0.02 s with locks, Procrastinate's default otherwise.
    """
    if poll_interval_s is None and lock_per_tenant:
        poll_interval_s = 0.02
    reset(dsn)
    h.execute(dsn, h.NOISY_TABLE_DDL)
    plan = [(1, big_jobs)] + [(t, small_jobs) for t in range(2, small_tenants + 2)]
    asyncio.run(_defer(dsn, plan, chunk_size=10_000, lock=lock_per_tenant))
    h.execute(
        dsn,
        "INSERT INTO peer_noisy_jobs (job_id, tenant, enqueued_at)"
        " SELECT j.id, substr(j.queue_name, 8)::int, e.at"
        " FROM procrastinate_jobs j JOIN procrastinate_events e"
        " ON e.job_id = j.id AND e.type = 'deferred'",
        "ANALYZE procrastinate_jobs",
    )
    cfg = {
        "dsn": dsn,
        "concurrency": slots,
        "pool_max": slots + 2,
        "job_seconds": job_seconds,
        "noisy": True,
        "wait": True,
        "poll_interval_s": poll_interval_s,
    }
    with h.WorkerPool(WORKER_ENTRY, [cfg]) as pool:
        pool.start()
        released = h.db_epoch(dsn)
        pool.go()
        wall_s = h.wait_until(dsn, DONE_SQL, timeout_s, pool)
        pool.check_alive_or_clean()
    out = h.noisy_summary(dsn, released)
    out.update(
        {
            "peer": PEER,
            "tenant_model": "queue per tenant" + (" + lock per tenant" if lock_per_tenant else ""),
            "slots": slots,
            "lock_per_tenant": lock_per_tenant,
            "poll_interval_s": poll_interval_s,
            "job_seconds": job_seconds,
            "jobs_expected": big_jobs + small_tenants * small_jobs,
            "wall_s": wall_s,
        }
    )
    return out


async def _worker(cfg: dict[str, Any]) -> None:
    from psycopg_pool import AsyncConnectionPool

    side: Any = None
    if cfg.get("noisy"):
        side = AsyncConnectionPool(
            cfg["dsn"], min_size=1, max_size=int(cfg["concurrency"]), open=False
        )
        await side.open()
    try:
        app = make_app(cfg["dsn"], cfg.get("pool_max"), side, float(cfg.get("job_seconds", 0)))
        async with app.open_async():
            await asyncio.get_running_loop().run_in_executor(None, h.say_ready_and_wait_for_go)
            options: dict[str, Any] = {
                "concurrency": int(cfg["concurrency"]),
                "wait": bool(cfg.get("wait", False)),
            }
            if cfg.get("poll_interval_s") is not None:
                options["fetch_job_polling_interval"] = float(cfg["poll_interval_s"])
            await app.run_worker_async(**options)
    finally:
        if side is not None:
            await side.close()


def worker_main() -> None:
    """Worker process entry: config JSON in argv[1]."""
    asyncio.run(_worker(h.worker_config()))


def run_all(dsn: str, n_jobs: int) -> dict[str, Any]:
    """Install, enqueue, drain (defaults, tuned sweep) and noisy neighbour (queue, lock)."""
    out: dict[str, Any] = {"loadavg_before": os.getloadavg(), "install": install(dsn)}
    reset(dsn)
    out["enqueue"] = enqueue(dsn, n_jobs, tenants=1)
    reset(dsn)
    out["enqueue_10_tenants"] = enqueue(dsn, n_jobs, tenants=10)
    out["drain_default"] = drain(dsn, n_jobs, **DEFAULTS)
    out["drain_tuned"] = drain_tuned(dsn, n_jobs)
    for key, lock in (("noisy_fifo", False), ("noisy_lock_per_tenant", True)):
        noisy = noisy_neighbour(dsn, lock_per_tenant=lock)
        noisy.pop("tenant_waits_s")
        out[key] = noisy
    reset(dsn)
    out["loadavg_after"] = os.getloadavg()
    return out


def main(argv: list[str] | None = None) -> None:
    """CLI: run every Procrastinate measurement and print one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", help="existing empty database (default: a scratch database)")
    parser.add_argument("--jobs", type=int, default=4_000)
    args = parser.parse_args(argv)
    if args.dsn:
        result = run_all(args.dsn, args.jobs)
    else:
        with h.scratch_database("peers_proc") as dsn:
            result = run_all(dsn, args.jobs)
    print(json.dumps(result))


if __name__ == "__main__":
    from fairq.bench.peers.procrastinate_bench import main as _main

    _main()
