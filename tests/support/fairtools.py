"""Helpers for the fair-engine tests: fill queues, claim concurrently, read scheduler state."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
import psycopg.sql

from fairq.models import NewJob
from fairq.policies import get_policy
from fairq.store import Store


def fill(store: Store, counts: dict[str, int], *, cost: dict[str, float] | None = None,
         interleave: bool = False, queue: str = "default") -> list[int]:
    """Enqueue counts[t] jobs per tenant (tenant by tenant, or interleaved)."""
    jobs: list[NewJob] = []
    if interleave:
        for i in range(max(counts.values())):
            jobs += [NewJob("t", t, "{}", queue=queue, cost=(cost or {}).get(t, 1.0))
                     for t, n in counts.items() if i < n]
    else:
        for t, n in counts.items():
            jobs += [NewJob("t", t, "{}", queue=queue, cost=(cost or {}).get(t, 1.0))] * n
    return store.enqueue(jobs)


def sql_rows(dsn: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


def running_mismatch(dsn: str) -> list[tuple[Any, ...]]:
    """(queue, tenant, schedule count, real count) where the running count is wrong."""
    return sql_rows(dsn, """
        SELECT ts.queue, ts.tenant, fairq.tenant_running(ts), coalesce(r.n, 0)
        FROM fairq.tenant_schedule ts
        LEFT JOIN (SELECT queue, tenant, count(*) n FROM fairq.jobs WHERE status = 'running'
                   GROUP BY 1, 2) r USING (queue, tenant)
        WHERE fairq.tenant_running(ts) <> coalesce(r.n, 0)""")


@dataclass
class DrainResult:
    order: list[str] = field(default_factory=list)   # tenant of each claimed job, claim order
    attempts: int = 0                                  # claim calls
    empty_while_work: int = 0                          # empty claims while >= workers*batch jobs left
    errors: list[str] = field(default_factory=list)


def drain_concurrently(store: Store, policy: str, *, workers: int, batch: int, total: int,
                       stop_after: int | None = None, finish: bool = True) -> DrainResult:
    """`workers` threads claim (and finish at once) until `total` (or `stop_after`) jobs."""
    pol = get_policy(policy)
    res = DrainResult()
    lock = threading.Lock()
    target = stop_after or total
    start = threading.Barrier(workers)

    def work(n: int) -> None:
        start.wait()
        while True:
            with lock:
                if len(res.order) >= target:
                    return
            try:
                got = store.claim(pol, queue="default", batch=batch, worker=f"w{n}")
                if finish and got:
                    store.finish_done([(j.id, j.attempts) for j in got])
            except Exception as exc:  # recorded: the test asserts there were none
                with lock:
                    res.errors.append(f"{type(exc).__name__}: {exc}")
                return
            with lock:
                res.attempts += 1
                if not got and total - len(res.order) >= workers * batch:
                    res.empty_while_work += 1
                res.order.extend(j.tenant for j in got)
                if not got and len(res.order) >= total:
                    return

    threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return res


def counts(order: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in order:
        out[t] = out.get(t, 0) + 1
    return out


def _fairq_tables(conn: psycopg.Connection[Any], schema: str) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename <> 'alembic_version' "
        "ORDER BY 1", (schema,)).fetchall()]


def keep_pristine_copy(dsn: str, schema: str, copy: str) -> None:
    """Copy every fairq table of ``schema`` (as migrated) into schema ``copy``: a module that
    restores it before each test avoids a CREATE and DROP DATABASE per test (seconds each on a
    busy small box)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE SCHEMA {}").format(psycopg.sql.Identifier(copy)))
        for t in _fairq_tables(conn, schema):
            conn.execute(psycopg.sql.SQL("CREATE TABLE {} AS SELECT * FROM {}").format(
                psycopg.sql.Identifier(copy, t), psycopg.sql.Identifier(schema, t)))


def restore_pristine(dsn: str, schema: str, copy: str) -> None:
    """Every fairq table of ``schema`` back to the content kept by ``keep_pristine_copy``."""
    ident = psycopg.sql.Identifier
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        tables = _fairq_tables(conn, schema)
        conn.execute(psycopg.sql.SQL("TRUNCATE {} RESTART IDENTITY").format(
            psycopg.sql.SQL(", ").join(ident(schema, t) for t in tables)))
        for t in tables:
            conn.execute(psycopg.sql.SQL("INSERT INTO {} OVERRIDING SYSTEM VALUE SELECT * FROM {}")
                         .format(ident(schema, t), ident(copy, t)))


@contextmanager
def holding_row(dsn: str, tenant: str, schema: str = "fairq") -> Iterator[None]:
    """Another transaction holds the tenant's schedule rows (as a claim serving it) meanwhile."""
    with psycopg.connect(dsn) as other:
        other.execute(psycopg.sql.SQL("SELECT 1 FROM {}.tenant_schedule WHERE tenant = %s "
                                      "FOR NO KEY UPDATE").format(psycopg.sql.Identifier(schema)),
                      (tenant,))
        try:
            yield
        finally:
            other.rollback()
