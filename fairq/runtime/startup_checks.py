"""What a worker says at start about settings that will hold it back, so no default limits it
silently."""

from __future__ import annotations

import logging

from fairq.store import Store
from fairq.store.errors import DatabaseError, PoolTimeout

log = logging.getLogger("fairq.worker")


def default_cap_note(default_cap: int, concurrency: int) -> str | None:
    """The line to log when the default per-tenant cap is below the worker's slots, else None."""
    if not 0 < default_cap < concurrency:
        return None
    return (f"tenants without a cap of their own run at most {default_cap} job(s) at a time (the "
            f"default max_running), fewer than this worker's {concurrency} slots: raise it with "
            f"app.tenants.set_defaults(max_running=N) or a tenants file's [defaults] table "
            f"(fairq tenants apply FILE), or per tenant with fairq tenants set T --max-running N")


def log_default_cap(store: Store, worker_id: str, concurrency: int) -> None:
    """One INFO line at start when the default cap is below ``concurrency``; nothing if the
    defaults cannot be read now (the loop reports an unreachable database itself)."""
    try:
        cap = store.get_tenant_defaults()[1]
    except (DatabaseError, PoolTimeout):
        return
    note = default_cap_note(cap, concurrency)
    if note:
        log.info("worker %s: %s", worker_id, note)
