"""PgQueuer peer benchmark: schema install, batch enqueue, drain, noisy neighbour.

A tenant maps to a PgQueuer entrypoint (``tenant_<n>``); PgQueuer's closest fairness knob is
the per-entrypoint ``concurrency_limit``, exposed here as ``per_tenant_limit``.

CLI: ``python -m fairq.bench.peers.pgqueuer_bench [--dsn DSN] [--jobs N]`` prints one JSON line.
Without ``--dsn`` it runs against a fresh random database that it drops afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import time
from typing import Any

from fairq.bench.peers import _harness as h

PEER = "pgqueuer"
DEFAULTS: dict[str, int] = {"processes": 1, "batch_size": 10}  # QueueManager.run / `pgq run`
TUNED: dict[str, int] = {"processes": 2, "batch_size": 500}
WORKER_ENTRY = "fairq.bench.peers.pgqueuer_bench:worker_main"


def tenant_entrypoint(tenant: int) -> str:
    """Entrypoint name that stands for ``tenant``."""
    return f"tenant_{tenant}"


async def _queries(dsn: str) -> tuple[Any, Any]:
    import asyncpg
    from pgqueuer import Queries

    conn = await asyncpg.connect(**h.asyncpg_kwargs(dsn))
    return conn, Queries.from_asyncpg_connection(conn)


def install(dsn: str) -> dict[str, Any]:
    """Install PgQueuer's schema with its own installer (``Queries.install``)."""

    async def run() -> None:
        conn, queries = await _queries(dsn)
        try:
            await queries.install()
        finally:
            await conn.close()

    t0 = time.perf_counter()
    asyncio.run(run())
    return {
        "peer": PEER,
        "version": importlib.metadata.version("pgqueuer"),
        "install_s": time.perf_counter() - t0,
    }


def reset(dsn: str) -> None:
    """Empty PgQueuer's queue, log and statistics and drop the noisy side table."""
    h.execute(
        dsn,
        "TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics RESTART IDENTITY",
        "DROP TABLE IF EXISTS peer_noisy_jobs",
    )


async def _enqueue(
    dsn: str, plan: list[tuple[int, int]], chunk_size: int
) -> tuple[list[float], list[int]]:
    """Enqueue (tenant, count) groups in order; return per-call seconds and all job ids."""
    conn, queries = await _queries(dsn)
    seconds: list[float] = []
    ids: list[int] = []
    try:
        for tenant, count in plan:
            for start in range(0, count, chunk_size):
                k = min(chunk_size, count - start)
                t0 = time.perf_counter()
                got = await queries.enqueue([tenant_entrypoint(tenant)] * k, [None] * k, [0] * k)
                seconds.append(time.perf_counter() - t0)
                ids.extend(int(x) for x in got)
    finally:
        await conn.close()
    return seconds, ids


async def _enqueue_mixed(dsn: str, n_jobs: int, tenants: int, chunk_size: int) -> float:
    """One batch call per chunk, tenants interleaved job by job; return seconds."""
    conn, queries = await _queries(dsn)
    try:
        eps = [tenant_entrypoint(1 + i % tenants) for i in range(n_jobs)]
        t0 = time.perf_counter()
        for start in range(0, n_jobs, chunk_size):
            chunk = eps[start : start + chunk_size]
            k = len(chunk)
            await queries.enqueue(chunk, [None] * k, [0] * k)
        return time.perf_counter() - t0
    finally:
        await conn.close()


def enqueue(dsn: str, n_jobs: int, tenants: int = 1, chunk_size: int = 10_000) -> dict[str, Any]:
    """Batch-enqueue ``n_jobs`` no-op jobs spread over ``tenants`` entrypoints; measure jobs/s.

    Uses ``Queries.enqueue`` with list arguments (one INSERT ... UNNEST per chunk).
    """
    seconds = asyncio.run(_enqueue_mixed(dsn, n_jobs, tenants, chunk_size))
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
    batch_size: int = DEFAULTS["batch_size"],
    tenants: int = 1,
    timeout_s: float = 600.0,
) -> dict[str, Any]:
    """Enqueue ``n_jobs`` no-op jobs, then drain them with ``processes`` workers.

    Timing starts when the ready workers are released and ends at the last ``successful`` log
    row (DB clock); ``wall_s`` is the same span seen by polling the queue table until empty;
    ``whole_s`` runs from the processes' start (interpreter, imports, connections) to their exit.
    """
    reset(dsn)
    prefill = enqueue(dsn, n_jobs, tenants)
    h.execute(dsn, "ANALYZE pgqueuer")
    cfg = {"dsn": dsn, "batch_size": batch_size, "tenants": tenants}
    whole_t0 = time.perf_counter()  # whole_s: the processes' start to their exit
    with h.WorkerPool(WORKER_ENTRY, [cfg] * processes) as pool:
        spawn_s = pool.start()
        t0_db = h.db_epoch(dsn)
        pool.go()
        wall_s = h.wait_until(
            dsn, "SELECT NOT EXISTS (SELECT 1 FROM pgqueuer)", timeout_s, pool
        )
        pool.wait_exit(60)
        whole_s = time.perf_counter() - whole_t0
        pool.check_alive_or_clean()
        pids = pool.pids
    done = int(h.fetch_value(dsn, "SELECT count(*) FROM pgqueuer_log WHERE status='successful'"))
    end_db = h.fetch_value(
        dsn,
        "SELECT EXTRACT(EPOCH FROM max(created)) FROM pgqueuer_log WHERE status='successful'",
    )
    seconds = float(end_db) - t0_db if end_db is not None else wall_s
    return {
        "peer": PEER,
        "jobs": n_jobs,
        "done": done,
        "processes": processes,
        "batch_size": batch_size,
        "tenants": tenants,
        "spawn_s": spawn_s,
        "seconds": seconds,
        "wall_s": wall_s,
        "whole_s": whole_s,
        "jobs_per_s": n_jobs / seconds if seconds > 0 else None,
        "prefill_jobs_per_s": prefill["jobs_per_s"],
        "worker_pids": pids,
    }


def noisy_neighbour(
    dsn: str,
    slots: int = 8,
    big_jobs: int = 1000,
    small_tenants: int = 10,
    small_jobs: int = 5,
    job_seconds: float = 0.01,
    per_tenant_limit: int = 0,
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """Tenant 1 enqueues ``big_jobs``, then tenants 2.. enqueue ``small_jobs`` each.

    One worker with ``slots`` concurrent tasks drains them; each handler stamps its start with
    the DB clock, then sleeps ``job_seconds``. ``per_tenant_limit`` > 0 sets PgQueuer's
    per-entrypoint ``concurrency_limit``. Enqueue time is the job's ``created`` column.
    """
    reset(dsn)
    h.execute(dsn, h.NOISY_TABLE_DDL)
    plan = [(1, big_jobs)] + [(t, small_jobs) for t in range(2, small_tenants + 2)]
    asyncio.run(_enqueue(dsn, plan, chunk_size=10_000))
    h.execute(
        dsn,
        "INSERT INTO peer_noisy_jobs (job_id, tenant, enqueued_at)"
        " SELECT id, substr(entrypoint, 8)::int, created FROM pgqueuer",
        "ANALYZE pgqueuer",
    )
    n_jobs = big_jobs + small_tenants * small_jobs
    # PgQueuer requires max_concurrent_tasks >= 2 * batch_size.
    batch_size = max(1, slots // 2)
    cfg = {
        "dsn": dsn,
        "batch_size": batch_size,
        "tenants": small_tenants + 1,
        "max_concurrent_tasks": slots,
        "per_tenant_limit": per_tenant_limit,
        "job_seconds": job_seconds,
        "noisy": True,
    }
    with h.WorkerPool(WORKER_ENTRY, [cfg]) as pool:
        pool.start()
        released = h.db_epoch(dsn)
        pool.go()
        wall_s = h.wait_until(
            dsn,
            "SELECT NOT EXISTS (SELECT 1 FROM pgqueuer)"
            " AND NOT EXISTS (SELECT 1 FROM peer_noisy_jobs WHERE started_at IS NULL)",
            timeout_s,
            pool,
        )
        pool.wait_exit(60)
        pool.check_alive_or_clean()
    out = h.noisy_summary(dsn, released)
    out.update(
        {
            "peer": PEER,
            "tenant_model": "entrypoint per tenant",
            "slots": slots,
            "batch_size": batch_size,
            "per_tenant_limit": per_tenant_limit,
            "job_seconds": job_seconds,
            "jobs_expected": n_jobs,
            "wall_s": wall_s,
        }
    )
    return out


async def _worker(cfg: dict[str, Any]) -> None:
    import asyncpg
    from pgqueuer import Job, QueueManager
    from pgqueuer.domain.types import QueueExecutionMode

    conn, queries = await _queries(cfg["dsn"])
    side: Any = None
    try:
        qm = QueueManager(queries)
        job_seconds = float(cfg.get("job_seconds", 0.0))
        if cfg.get("noisy"):
            side = await asyncpg.create_pool(
                **h.asyncpg_kwargs(cfg["dsn"]),
                min_size=1,
                max_size=int(cfg.get("max_concurrent_tasks") or 8),
            )

        async def handler(job: Job) -> None:
            if side is not None:
                await side.execute(h.NOISY_START_SQL, job.id)
            if job_seconds:
                await asyncio.sleep(job_seconds)

        for t in range(1, int(cfg["tenants"]) + 1):
            qm.entrypoint(
                tenant_entrypoint(t), concurrency_limit=int(cfg.get("per_tenant_limit", 0))
            )(handler)
        await asyncio.get_running_loop().run_in_executor(None, h.say_ready_and_wait_for_go)
        await qm.run(
            batch_size=int(cfg["batch_size"]),
            mode=QueueExecutionMode.drain,
            max_concurrent_tasks=cfg.get("max_concurrent_tasks"),
        )
    finally:
        if side is not None:
            await side.close()
        if not conn.is_closed():
            await conn.close()


def worker_main() -> None:
    """Worker process entry: config JSON in argv[1]; uses uvloop like ``pgq run``."""
    cfg = h.worker_config()
    try:
        import uvloop

        uvloop.run(_worker(cfg))
    except ImportError:
        asyncio.run(_worker(cfg))


def run_all(dsn: str, n_jobs: int, enqueue_jobs: int | None = None) -> dict[str, Any]:
    """Install, enqueue, drain (defaults, tuned) and noisy neighbour (FIFO, capped)."""
    out: dict[str, Any] = {"loadavg_before": os.getloadavg(), "install": install(dsn)}
    reset(dsn)
    out["enqueue"] = enqueue(dsn, enqueue_jobs or n_jobs, tenants=1)
    reset(dsn)
    out["enqueue_10_tenants"] = enqueue(dsn, enqueue_jobs or n_jobs, tenants=10)
    out["drain_default"] = drain(dsn, n_jobs, **DEFAULTS)
    out["drain_tuned"] = drain(dsn, n_jobs, **TUNED)
    for key, limit in (("noisy_fifo", 0), ("noisy_limit_4", 4)):
        noisy = noisy_neighbour(dsn, per_tenant_limit=limit)
        noisy.pop("tenant_waits_s")
        out[key] = noisy
    reset(dsn)
    out["loadavg_after"] = os.getloadavg()
    return out


def main(argv: list[str] | None = None) -> None:
    """CLI: run every PgQueuer measurement and print one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", help="existing empty database (default: a scratch database)")
    parser.add_argument("--jobs", type=int, default=20_000)
    args = parser.parse_args(argv)
    if args.dsn:
        result = run_all(args.dsn, args.jobs)
    else:
        with h.scratch_database("peers_pgq") as dsn:
            result = run_all(dsn, args.jobs)
    print(json.dumps(result))


if __name__ == "__main__":
    from fairq.bench.peers.pgqueuer_bench import main as _main

    _main()
