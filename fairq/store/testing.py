"""The test mode's database work (``fairq.testing``): reading what a test enqueued, on its own
connection when it gives one; a tenant's due jobs; a connection whose
transaction the test enqueues in and that is rolled back after it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row

from fairq.models import JobInfo
from fairq.store.caller_connection import connection_for
from fairq.store.pg import Store


def enqueued_jobs(store: Store, *, task: str | None, tenant: str | None, queue: str | None,
                  statuses: Sequence[str] | None, payload_json: str | None, limit: int,
                  connection: Any = None) -> list[JobInfo]:
    """The jobs matching every filter given (None: any), oldest first, at most ``limit``."""
    params = {"task": task, "tenant": tenant, "queue": queue,
              "statuses": list(statuses) if statuses is not None else None,
              "payload": payload_json, "limit": limit}
    statement = store.statement("testing_enqueued")
    if connection is not None:
        with connection_for(connection).cursor(row_factory=dict_row) as cur:
            cur.execute(statement, params)
            rows = cur.fetchall()
    else:
        with store.cursor() as cur:
            cur.execute(statement, params)
            rows = cur.fetchall()
    return [JobInfo(**row) for row in rows]


def due_count(store: Store, queues: Sequence[str], tenant: str) -> int:
    """How many of ``tenant``'s jobs in ``queues`` are due now."""
    with store.cursor() as cur:
        cur.execute(store.statement("testing_due"), {"queues": list(queues), "tenant": tenant})
        row = cur.fetchone()
    return int(row["n"]) if row else 0


@contextmanager
def rolled_back(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection inside an open transaction, rolled back (and closed) after the block."""
    with psycopg.connect(dsn) as conn:
        try:
            yield conn
        finally:
            conn.rollback()
