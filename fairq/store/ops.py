"""An operator's database operations (``fairq jobs/retry/cancel --tenant/tenants delete|reset``).

Kept apart from the hot path in ``pg.py``: these run rarely, by hand, and are bounded by a
limit. The statements (``fairq/sql/ops.sql``) never touch a running job and skip queued jobs a
claim holds, so they are safe while workers run.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import psycopg

from fairq import sql
from fairq.errors import InvalidInput
from fairq.models import JobInfo
from fairq.store.pg import Store
from fairq.store.settings import retrying

_JOB_FIELDS = {f.name for f in fields(JobInfo)}


def _job(row: dict[str, Any]) -> JobInfo:
    return JobInfo(**{k: v for k, v in row.items() if k in _JOB_FIELDS})


def list_jobs(store: Store, *, status: str | None = None, tenant: str | None = None,
              task: str | None = None, queue: str | None = None,
              limit: int = 100) -> list[JobInfo]:
    """Jobs matching every filter given, newest first, at most ``limit``."""
    with store.cursor() as cur:
        cur.execute(store.statement("list_jobs"), {"status": status, "tenant": tenant, "task": task,
                                           "queue": queue, "limit": limit})
        return [_job(r) for r in cur.fetchall()]


@dataclass(frozen=True, slots=True)
class KeyHeld:
    """A job ``retry_jobs`` left as it was: ``holder`` holds its idempotency ``key`` (a live job
    of its task and tenant, or a job with the same key retried by the same statement)."""

    id: int
    key: str
    holder: int


def retry(store: Store, ids: list[int] | None, *, tenant: str | None = None,
          limit: int = 1000) -> tuple[list[int], list[KeyHeld], dict[int, str]]:
    """Failed or cancelled jobs (``ids``, or with None up to ``limit`` failed ones, optionally
    of ``tenant``) queued again, due now, attempts reset. Returns the ids retried, the jobs left
    as they were because their key is held, and the jobs the database refused (id: why)."""
    try:
        retried, held = _retry(store, ids, tenant=tenant, limit=limit)
        return retried, held, {}
    except psycopg.errors.UniqueViolation:
        pass
    # An enqueue took one of the keys while the statement ran (or the keys' unique index is
    # stricter than the statement's check): one job at a time, so that each fails alone.
    retried, held, refused = [], [], {}
    for job_id in ids or retry_candidates(store, tenant=tenant, limit=limit):
        try:
            done, held_one = _retry(store, [job_id], tenant=None, limit=1)
        except psycopg.errors.UniqueViolation as exc:
            detail = " ".join((exc.diag.message_detail or "").split())
            refused[job_id] = ("its idempotency key is held by another queued or running job"
                               + (f" ({detail})" if detail else ""))
            continue
        retried += done
        held += held_one
    return retried, held, refused


def _retry(store: Store, ids: list[int] | None, *, tenant: str | None,
           limit: int) -> tuple[list[int], list[KeyHeld]]:
    with store.cursor() as cur:
        cur.execute(store.statement("retry_jobs"), {"ids": ids, "tenant": tenant, "limit": limit,
                                            "channel": store.channel})
        rows = cur.fetchall()
    return ([int(r["id"]) for r in rows if r["held_by"] is None],
            [KeyHeld(int(r["id"]), str(r["key"]), int(r["held_by"]))
             for r in rows if r["held_by"] is not None])


def retry_candidates(store: Store, *, tenant: str | None, limit: int) -> list[int]:
    """The failed jobs ``retry`` without ids would pick (of ``tenant``), oldest finish first."""
    with store.cursor() as cur:
        cur.execute(store.statement("failed_jobs"), {"tenant": tenant, "limit": limit})
        return [int(r["id"]) for r in cur.fetchall()]


def job_states(store: Store, ids: list[int]) -> dict[int, str]:
    """The status of each of ``ids`` that exists."""
    with store.cursor() as cur:
        cur.execute(store.statement("job_states"), {"ids": ids})
        return {int(r["id"]): str(r["status"]) for r in cur.fetchall()}


def cancel_tenant(store: Store, tenant: str, *, queue: str | None = None,
                  limit: int = 100_000) -> int:
    """Cancel up to ``limit`` of ``tenant``'s queued jobs in one statement; returns how many."""
    with store.cursor() as cur:
        cur.execute(store.statement("cancel_tenant"), {"tenant": tenant, "queue": queue, "limit": limit})
        return len(cur.fetchall())


def reset_tenant(store: Store, tenant: str) -> bool:
    """See ``_reset_tenant``; tried again when it lost a deadlock (fairq.store.settings)."""
    return retrying(lambda: _reset_tenant(store, tenant))


def _reset_tenant(store: Store, tenant: str) -> bool:
    """Drop ``tenant``'s own weight, cap, rate limit and group: the defaults apply from the next
    claim. Returns whether it had settings of its own. Under the tenant's settings lock
    (``fairq.store.settings``), the defaults read in the same transaction."""
    with store.cursor(atomic=True) as cur:
        cur.execute(store.statement("lock_settings"), {"tenants": [tenant]})
        cur.execute(store.statement("get_defaults"))
        d = cur.fetchone() or {"weight": 1.0, "max_running": 10, "rate": None, "burst": None}
        cur.execute(store.statement("delete_tenant_config"), {"tenant": tenant})
        had = cur.fetchone() is not None
        cur.execute(store.statement("sync_tenant_to_defaults"),
                    {"tenant": tenant, "weight": d["weight"], "max_running": d["max_running"],
                     "rate": d["rate"], "burst": d["burst"]})
    return had


def delete_tenant(store: Store, tenant: str) -> bool:
    """See ``_delete_tenant``; tried again when it lost a deadlock (fairq.store.settings)."""
    return retrying(lambda: _delete_tenant(store, tenant))


def _delete_tenant(store: Store, tenant: str) -> bool:
    """Forget ``tenant``: its settings and its schedule rows. Refused (``InvalidInput``,
    nothing changed) while it has queued or running jobs. Returns whether fairq knew it.

    The tenant's settings lock comes first: an enqueue creating one of its schedule rows holds
    it shared until it commits, so the delete then sees that enqueue's job and is refused; an
    enqueue that finds its row gone after this commits creates it again (enqueue.sql). The
    restore after it is the belt to those braces."""
    with store.cursor(atomic=True) as cur:
        cur.execute(store.statement("lock_settings"), {"tenants": [tenant]})
        cur.execute(store.statement("delete_tenant_schedule"), {"tenant": tenant})
        scheduled = bool(cur.fetchall())
        cur.execute(store.statement("tenant_jobs_pending"), {"tenant": tenant})
        row = cur.fetchone() or {"queued": 0, "running": 0}
        if row["queued"] or row["running"]:
            raise InvalidInput(
                f"tenant {tenant!r} has {row['queued']} queued and {row['running']} running "
                f"job(s): cancel them first (fairq cancel --tenant {tenant}) and let the running "
                "ones finish")
        cur.execute(store.statement("delete_tenant_config"), {"tenant": tenant})
        configured = cur.fetchone() is not None
    with store.cursor(atomic=True) as cur:
        cur.execute(store.statement("lock_settings"), {"tenants": [tenant]})
        cur.execute(store.statement("restore_tenant_schedule"), {"tenant": tenant})
    return scheduled or configured


def drop_schema(dsn: str, schema: str) -> None:
    """Drop ``schema`` and everything in it: the demo's scratch schemas, on a connection of its
    own (the app that used it is closed by then)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.statement("drop_schema", schema), prepare=False)
