"""The operator console's reads (``fairq web``): the statements of ``fairq/sql/web.sql``, each
group in one bounded, read-only transaction on a connection of the app's pool.

The tenant list is paged here, on the server: the page comes from the schedule rows' own
columns, and only the page's tenants get the columns that read their jobs (queued, oldest wait,
reason, share of recent claims), so a page costs the same at 100 tenants as at 100,000.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row

from fairq.store.pg import Store
from fairq.store.workers import MISSED_BEATS

# The tenant list's server-side orders: columns of tenant_schedule itself (web.sql).
SORTS = ("tenant", "queue", "weight", "cap", "running", "group", "rate")


@contextmanager
def _read(store: Store, timeout_ms: int) -> Iterator[psycopg.Cursor[dict[str, Any]]]:
    """A read-only transaction under ``timeout_ms`` with the planner's defaults back (the
    overview aggregates whole tables, like ``fairq stats``)."""
    with store.pool.connection() as conn, conn.transaction(), \
            conn.cursor(row_factory=dict_row) as cur:
        cur.execute(store.statement("stats_timeouts"), {"timeout_ms": str(timeout_ms)})
        yield cur


def tenant_page(store: Store, *, search: str | None, queue: str | None, sort: str, desc: bool,
                limit: int, offset: int, window_s: float,
                timeout_ms: int) -> tuple[int, list[dict[str, Any]]]:
    """(rows matching, the page's rows): each row the schedule's columns and the page's facts
    (``console_tenant_facts``: reason, queued, due, oldest wait, claim and weight shares)."""
    if sort not in SORTS:
        raise ValueError(f"sort must be one of {SORTS}")
    where = {"search": search or None, "queue": queue}
    with _read(store, timeout_ms) as cur:
        cur.execute(store.statement("console_tenant_count"), where)
        row = cur.fetchone()
        total = int(row["total"]) if row else 0
        cur.execute(store.statement("console_tenant_page"),
                    {**where, "sort": sort, "desc": desc, "limit": limit, "offset": offset})
        page = cur.fetchall()
        facts = _facts(store, cur, page, window_s)
    for r in page:
        r.update(facts.get((r["queue"], r["tenant"]), {}))
    return total, page


def _facts(store: Store, cur: psycopg.Cursor[dict[str, Any]], page: list[dict[str, Any]],
           window_s: float) -> dict[tuple[str, str], dict[str, Any]]:
    if not page:
        return {}
    cur.execute(store.statement("console_tenant_facts"), {
        "queues": [r["queue"] for r in page], "tenants": [r["tenant"] for r in page],
        "window": float(window_s), "missed_beats": float(MISSED_BEATS)})
    return {(f["queue"], f["tenant"]): f for f in cur.fetchall()}


def overview(store: Store, *, minutes: int, timeout_ms: int) -> dict[str, list[dict[str, Any]]]:
    """The queues' depth, claims and done jobs per minute and in the last 60 s, and the
    worker registry."""
    with _read(store, timeout_ms) as cur:
        cur.execute(store.statement("console_queues"))
        queues = cur.fetchall()
        cur.execute(store.statement("console_rates"), {"minutes": minutes})
        rates = cur.fetchall()
        cur.execute(store.statement("console_last_minute"))
        last = cur.fetchone() or {"claims": 0, "done": 0}
        cur.execute(store.statement("console_workers"), {"missed_beats": float(MISSED_BEATS)})
        workers = cur.fetchall()
    return {"queues": queues, "rates": rates, "last_minute": [last], "workers": workers}


def tenant_history(store: Store, tenant: str, *, bucket_s: int, buckets: int,
                   timeout_ms: int) -> list[dict[str, Any]]:
    """Per time bucket: the tenant's mean wait and its claims beside all claims of its queues."""
    with _read(store, timeout_ms) as cur:
        cur.execute(store.statement("console_tenant_history"),
                    {"tenant": tenant, "bucket": bucket_s, "buckets": buckets})
        return cur.fetchall()


def tenant_rows(store: Store, tenant: str, *, window_s: float,
                timeout_ms: int) -> list[dict[str, Any]]:
    """The tenant's schedule rows (one per queue) with the same facts as the list's."""
    with _read(store, timeout_ms) as cur:
        cur.execute(store.statement("console_tenant_queues"), {"tenant": tenant})
        rows = cur.fetchall()
        facts = _facts(store, cur, rows, window_s)
    for r in rows:
        r.update(facts.get((r["queue"], r["tenant"]), {}))
    return rows
