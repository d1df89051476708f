"""Claims whose commit is unknown: the connection was lost while the claim ran or committed, so
the worker cannot tell whether it holds the jobs. It asks the database instead of waiting for
their leases (docs/reliability.md, "Outages")."""

from __future__ import annotations

from collections.abc import Collection

from fairq.runtime.state import Shared, log
from fairq.store import Store
from fairq.store.workers import held_jobs


def read_back(store: Store, shared: Shared, worker_id: str,
              finished: Collection[tuple[int, int]] = ()) -> int:
    """Hand back at once (fenced, their attempt undone) the jobs the database says run under
    ``worker_id``'s leases that this worker never received; returns how many.

    ``finished``: (id, attempt) of the finishes written lately. A crash of the database may
    have undone them, leaving their jobs running under our leases: those ran, and the
    finisher writes them again (``Finisher.recent``); handing them back would run them again.

    Only the control thread claims, and it is the caller: no job can be received while this
    runs. A job finished meanwhile is no longer ``running``, and the hand-back's fence leaves it
    alone.
    """
    held = held_jobs(store, worker_id)
    with shared.lock:
        known = {*shared.inflight, *shared.unwritten,
                 *((c.job.id, c.job.attempt) for c in shared.completions)}
    lost = [key for key in held if key not in known and key not in finished]
    if not lost:
        return 0
    released = store.release_unstarted(lost, started=[held[key] for key in lost])
    if not released:
        return 0
    shared.stats.released += len(released)
    log.warning("worker %s: a claim whose answer was lost with its connection had committed: "
                "handed back %d job(s) it never received", worker_id, len(released))
    return len(released)
