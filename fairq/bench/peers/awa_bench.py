"""awa-pg peer benchmark: migrate, bulk enqueue, drain no-op jobs with N workers in one process.

awa-pg (PyPI ``awa-pg``) is awa's Rust engine under a Python SDK; it is not in the bench extra
(``.venv/bin/pip install awa-pg``, a binary wheel). A run migrates awa's schema into the
database it is given, enqueues ``--jobs`` no-op jobs with ``insert_many_copy`` (a COPY; its
other COPY path, ``enqueue_many_copy``, needs the queue-storage backend selected, which a fresh
``migrate`` does not do), whose jobs/s is the enqueue figure, starts ``--workers`` workers on
the queue and stops them once every job ran. Drain time runs from the first handler call to
the last one (the process's clock: awa's completions are written after the handler returns, so
the last few writes are left out, as are start-up and shut-down).

CLI: ``python -m fairq.bench.peers.awa_bench --dsn DSN [--jobs N] [--workers W]`` prints one JSON
line; ``drain`` runs it in a subprocess, so the caller need not import awa.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

PEER = "awa-pg"
QUEUE = "bench"


@dataclass
class Noop:
    """The no-op job's arguments (awa wants a type per kind)."""

    n: int


def available() -> str | None:
    """awa-pg's version if it is installed, else None."""
    try:
        return importlib.metadata.version("awa-pg")
    except importlib.metadata.PackageNotFoundError:
        return None


def _url(dsn: str) -> str:
    """``dsn`` as a URL (awa takes no ``key=value`` connection string)."""
    from urllib.parse import quote

    from psycopg.conninfo import conninfo_to_dict

    c = conninfo_to_dict(dsn)
    auth = quote(str(c.get("user", "postgres")), safe="")
    if c.get("password"):
        auth += ":" + quote(str(c["password"]), safe="")
    return (f"postgresql://{auth}@{c.get('host', '127.0.0.1')}:{c.get('port', 5432)}/"
            f"{quote(str(c.get('dbname', 'postgres')), safe='')}")


async def _run(dsn: str, jobs: int, workers: int, timeout_s: float) -> dict[str, Any]:
    import awa

    client = awa.AsyncClient(_url(dsn))
    await client.migrate()
    items = [Noop(i) for i in range(jobs)]
    t0 = time.perf_counter()
    await client.insert_many_copy(items, queue=QUEUE)
    enqueue_s = time.perf_counter() - t0
    stamps: list[float] = []
    all_ran = asyncio.Event()

    @client.task(Noop, queue=QUEUE)
    async def noop(job: Any) -> None:
        stamps.append(time.perf_counter())
        if len(stamps) >= jobs:
            all_ran.set()

    await client.start([(QUEUE, workers)])
    try:
        await asyncio.wait_for(all_ran.wait(), timeout_s)
    finally:
        await client.shutdown()
        await client.close()
    seconds = stamps[-1] - stamps[0] if len(stamps) > 1 else float("nan")
    return {"peer": PEER, "version": available(), "jobs": jobs, "workers": workers,
            "done": len(stamps), "seconds": seconds,
            "jobs_per_s": len(stamps) / seconds if seconds > 0 else None,
            "enqueue_jobs_per_s": jobs / enqueue_s}


def drain(dsn: str, jobs: int, workers: int, timeout_s: float = 600.0) -> dict[str, Any]:
    """Run one drain in a subprocess (a fresh database expected: awa's schema goes into it)."""
    out = subprocess.run([sys.executable, "-m", "fairq.bench.peers.awa_bench", "--dsn", dsn,
                          "--jobs", str(jobs), "--workers", str(workers)],
                         capture_output=True, text=True, timeout=timeout_s + 60, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"awa-pg drain failed: {out.stderr.strip()[-500:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dsn", required=True)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--workers", type=int, default=32)
    p.add_argument("--timeout", type=float, default=600.0)
    a = p.parse_args()
    print(json.dumps(asyncio.run(_run(a.dsn, a.jobs, a.workers, a.timeout))))


if __name__ == "__main__":
    main()
