"""The worker registry's writes: a worker's row at start and at every beat, gone at a clean stop
(``fairq/sql/workers.sql``). Readers judge liveness by ``seen_at`` (``tenant_waits``). And what
a worker asks of the jobs after an outage: which it holds, whether a lease expired
(``fairq/sql/drain.sql``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from fairq.store.pg import Store

# A worker not seen for this many of its beats is dead to the readers: one late beat (a busy
# database, a pause of the process) does not make its queues look unserved.
MISSED_BEATS = 3


def register_worker(store: Store, worker_id: str, *, queues: Sequence[str], policy: str,
                    beat_seconds: float) -> None:
    """Write the worker's row (created by its first beat), seen now on the database clock."""
    with store.cursor() as cur:
        cur.execute(store.statement("register_worker"),
                    {"worker_id": worker_id, "queues": list(queues), "policy": policy,
                     "beat_seconds": float(beat_seconds)})


def unregister_worker(store: Store, worker_id: str) -> None:
    """Delete the worker's row: at a clean stop it is gone at once, not after missed beats."""
    with store.cursor() as cur:
        cur.execute(store.statement("unregister_worker"), {"worker_id": worker_id})


def held_jobs(store: Store, worker_id: str) -> dict[tuple[int, int], datetime]:
    """(id, attempts) of the jobs running under ``worker_id``'s leases, with each claim's time
    (the fence of its hand-back)."""
    with store.cursor() as cur:
        cur.execute(store.statement("held_jobs"), {"worker": worker_id})
        return {(int(r["id"]), int(r["attempts"])): r["started_at"] for r in cur.fetchall()}


def expired_lease_exists(store: Store) -> bool:
    """Whether a running job's lease has expired (and is not reaped yet)."""
    with store.cursor() as cur:
        cur.execute(store.statement("expired_lease_exists"))
        row = cur.fetchone()
    return bool(row and row["expired"])
