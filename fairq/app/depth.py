"""``app.queue_depth()``: how many jobs wait and run, per queue and tenant or in total."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fairq import validation as v

if TYPE_CHECKING:
    from fairq.store import Store

TIMEOUT_MS = 10_000


@dataclass(frozen=True, slots=True)
class QueueDepth:
    """Jobs by status: ``queued`` = ``due`` (``run_at`` has come) + ``delayed``; ``done`` and
    ``failed`` count the finished jobs still kept (the pruner deletes old ones)."""

    queued: int
    due: int
    delayed: int
    running: int
    done: int
    failed: int


def queue_depth(store: Store, queue: str | None, tenant: str | None) -> QueueDepth:
    """The counts of one queue and/or one tenant (None: all), read in one bounded transaction
    from the same rows as ``fairq stats``."""
    from fairq.store.monitor import tenant_stats

    if queue is not None:
        v.name("queue", queue)
    if tenant is not None:
        v.name("tenant", tenant)
    stats, _ = tenant_stats(store, window_s=0.0, queue=queue, timeout_ms=TIMEOUT_MS)
    rows = [r for r in stats if tenant is None or r["tenant"] == tenant]
    due, delayed, running, done, failed = (
        sum(int(r[k]) for r in rows) for k in ("due", "delayed", "running", "done", "failed"))
    return QueueDepth(queued=due + delayed, due=due, delayed=delayed, running=running,
                      done=done, failed=failed)
