"""The sync store: fairq's database operations on one schema, one method per operation.

Every method is one short transaction (autocommit, or the caller's own transaction for
enqueue), so no transaction stays open while a handler runs. The sessions it runs on, their
settings and the cursor of each operation are ``StoreSessions``' (``store.sessions``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Sequence
from dataclasses import fields
from datetime import datetime
from typing import Any

import psycopg

from fairq import sql
from fairq.models import (
    ClaimedJob,
    ClaimPlan,
    FinishedJob,
    JobInfo,
    NewJob,
    NewJobColumns,
    ReapResult,
    TraceContext,
)
from fairq.store.caller_connection import connection_for
from fairq.store.enqueue import CHUNK, as_invalid_input
from fairq.store.tenants import TenantSettings
from fairq.store.traces import check_trace, enqueue_call

# Virtual time is rebased once a queue's lowest active vtime passes 2^20: below 2^21 a float8's
# resolution is 2^-32, so even the smallest increment (1 / 1000, a weight of 1000) is kept to
# within 2e-7 of its value, however many claims a queue has served.
VTIME_REBASE_AT = float(2 ** 20)


class Store(TenantSettings):
    """fairq's database operations on one schema."""

    # -- producers ----------------------------------------------------------------------
    def enqueue(self, jobs: Sequence[NewJob] | NewJobColumns, connection: Any = None, *,
                trace: TraceContext | None = None) -> list[int]:
        """Insert ``jobs`` (one round trip per chunk); in ``connection``'s transaction if given."""
        columns = jobs if isinstance(jobs, NewJobColumns) else NewJobColumns.of(jobs)
        return self.enqueue_chunks((columns.chunk(start, start + CHUNK)
                                    for start in range(0, len(columns), CHUNK)), connection,
                                   trace=trace)

    def enqueue_chunks(self, chunks: Iterable[NewJobColumns], connection: Any = None, *,
                       trace: TraceContext | None = None) -> list[int]:
        """Insert the jobs of ``chunks`` (of ``CHUNK`` jobs each but the last: one statement a
        chunk), in ``connection``'s transaction if given, else all or none in one of their own.
        Several chunks go down one pipeline, so a lazy ``chunks`` makes (and checks) the next
        chunk while the server inserts the last; with ``connection`` they are all made first:
        nothing may be written to the caller's transaction before every job is checked. With
        ``trace``, each job's row in job_traces is written by the statement that inserts it."""
        if trace is not None:
            check_trace(trace)
        rest = iter(chunks)
        first = next(rest, None)
        if first is None or not len(first):
            return []
        if connection is not None:
            conn = connection_for(connection)
            later = list(rest)
            if not later:
                with conn.cursor() as cur:
                    return self._enqueue_chunk(cur, first, trace)
            return self._enqueue_pipeline(conn, first, later, trace)
        if len(first) < CHUNK:  # the only chunk: one statement, its own transaction
            with self.cursor() as cur:
                return self._enqueue_chunk(cur, first, trace)
        # All chunks or none; the timeouts apply too: a locked table must not hang producers.
        with self.cursor(atomic=True) as cur:
            return self._enqueue_pipeline(cur.connection, first, rest, trace)

    def _enqueue_chunk(self, cur: psycopg.Cursor[Any], jobs: NewJobColumns,
                       trace: TraceContext | None = None) -> list[int]:
        name, params = enqueue_call(jobs, trace)
        try:
            cur.execute(self.statement(name), params)
        except psycopg.Error as exc:
            raise as_invalid_input(exc) from None
        return _enqueued_ids(cur.fetchone())

    def _enqueue_pipeline(self, conn: psycopg.Connection[Any], first: NewJobColumns,
                          rest: Iterable[NewJobColumns], trace: TraceContext | None) -> list[int]:
        """Each chunk's statement sent as soon as it is made, the ids read once all are in."""
        cursors: list[psycopg.Cursor[Any]] = []
        try:
            with conn.pipeline():
                for chunk in itertools.chain((first,), rest):
                    cursors.append(cur := conn.cursor())
                    name, params = enqueue_call(chunk, trace)
                    cur.execute(self.statement(name), params)
            return [job_id for cur in cursors for job_id in _enqueued_ids(cur.fetchone())]
        except psycopg.Error as exc:
            raise as_invalid_input(exc) from None
        finally:
            for cur in cursors:
                cur.close()

    # -- workers ------------------------------------------------------------------------
    def claim(self, policy: ClaimPlan, *, queue: str, batch: int, worker: str) -> list[ClaimedJob]:
        """Claim up to ``batch`` jobs of ``queue`` under ``policy``, committed: one statement, or
        two when a waiting policy's first took nothing while it held a lock (it then could not
        wait; the second, holding nothing, waits for a held tenant). A first statement that
        held nothing has waited itself: a poll of a queue whose tenants are all idle is one
        statement.

        No state is kept between claims: what a claim does depends on the database alone.
        """
        if batch <= 0:
            return []
        params = policy.claim_params(queue=queue, batch=batch, worker=worker)
        rows = self._claim_rows(policy.statement, params)
        if rows and rows[0]["id"] is None:
            # claim_fair's row of NULLs, never a job: it took nothing while holding a lock. Every
            # tenant with a due job may be held by other claims or finishes; the same statement
            # again, holding nothing, waits for the first of them (docs/algorithm.md).
            if not policy.waits:
                return []
            params["wait"] = True
            rows = self._claim_rows(policy.statement, params)
        return [_claimed(r) for r in rows]

    def next_wake(self, queue: str) -> float | None:
        """Seconds until the first idle tenant of ``queue`` is due to wake (a delayed job, a
        retry, a rate-limited tenant's next token); None when none is waiting."""
        with self.cursor() as cur:
            cur.execute(self.statement("next_wake"), {"queue": queue})
            row = cur.fetchone()
        return None if row is None else float(row["seconds"])

    def next_token(self, queues: Sequence[str]) -> float | None:
        """Seconds until the first rate-limited tenant of ``queues`` with a due job and a free
        slot has its next token (0 if it has one now); None when no due job waits for a token."""
        with self.cursor() as cur:
            cur.execute(self.statement("next_token"), {"queues": list(queues)})
            row = cur.fetchone()
        return None if row is None else float(row["seconds"])

    def _claim_rows(self, statement: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        # Positional and raw: psycopg does not parse the claim's text, whatever its length
        # (psycopg caches its parse of texts up to 4 KiB only; fairq/sql/__init__.py).
        stmt = sql.positional(statement, self.schema)
        with self.cursor(raw=True) as cur:
            cur.execute(stmt.text, stmt.values(params))
            return cur.fetchall()

    def finish_done(self, done: Sequence[tuple[int, int]],
                    results: Sequence[str | None] | None = None,
                    notes: Sequence[str | None] | None = None,
                    run_seconds: Sequence[float] | None = None, *,
                    started: list[datetime] | None = None) -> list[FinishedJob]:
        """Mark (id, attempts) pairs done; returns those that were still ours. ``results``
        (JSON texts) and ``notes`` (why a result was not stored), if given, go with ``done``;
        so do ``run_seconds``, the handlers' run times the worker measured (policy time charges
        them; None: the database's started_at to now), and ``started``, each claim's started_at
        (the fence; jobs.sql says why)."""
        if not done:
            return []
        with self.cursor() as cur:
            cur.execute(
                self.statement("finish_done"),
                {"ids": [d[0] for d in done], "attempts": [d[1] for d in done],
                 # a NULL array, not one of NULLs, when the batch has none (the common case)
                 "results": list(results) if results and any(r is not None for r in results)
                 else None,
                 "notes": list(notes) if notes and any(n is not None for n in notes) else None,
                 "run_seconds": _run_seconds(run_seconds), "started": started},
            )
            return [FinishedJob(status="done", **r) for r in cur.fetchall()]

    def finish_failed(
        self, failures: Sequence[tuple[int, int, str, float | None]], final: Sequence[int] = (),
        run_seconds: Sequence[float] | None = None, *, started: list[datetime] | None = None,
    ) -> list[FinishedJob]:
        """Record (id, attempts, error, retry_delay or None for the backoff) failures; the ids
        in ``final`` fail for good, whatever attempts they have left; the rest: as finish_done's."""
        if not failures:
            return []
        with self.cursor() as cur:
            cur.execute(
                self.statement("finish_failed"),
                {
                    "ids": [f[0] for f in failures],
                    "attempts": [f[1] for f in failures],
                    "errors": [f[2] for f in failures],
                    "retry_delays": [f[3] for f in failures],
                    "final": list(final),
                    "run_seconds": _run_seconds(run_seconds),
                    "started": started,
                },
            )
            return [FinishedJob(**r) for r in cur.fetchall()]

    def extend_leases(
        self, jobs: Sequence[tuple[int, int]], seconds: float | None = None, *,
        started: list[datetime] | None = None,
    ) -> set[int]:
        """Extend the leases of (id, attempts) pairs (``started``: as finish_done's)."""
        if not jobs:
            return set()
        with self.cursor() as cur:
            cur.execute(
                self.statement("extend_leases"),
                {"ids": [j[0] for j in jobs], "attempts": [j[1] for j in jobs], "seconds": seconds,
                 "started": started},
            )
            return {int(r["id"]) for r in cur.fetchall()}

    def release_unstarted(self, jobs: Sequence[tuple[int, int]], *,
                          started: list[datetime] | None = None) -> set[int]:
        """Hand back claimed but unstarted (id, attempts) jobs (``started``: as finish_done's)."""
        if not jobs:
            return set()
        with self.cursor() as cur:
            cur.execute(
                self.statement("release_unstarted"),
                {"ids": [j[0] for j in jobs], "attempts": [j[1] for j in jobs],
                 "started": started},
            )
            return {int(r["id"]) for r in cur.fetchall()}

    def hand_back_running(self, jobs: Sequence[tuple[int, int]], notes: Sequence[str],
                          run_seconds: Sequence[float] | None = None, *,
                          started: list[datetime] | None = None) -> dict[int, str]:
        """Hand back (id, attempts) jobs still running when a stopping worker's grace period
        ended, each with its note for last_error (``run_seconds``, ``started``: as
        finish_done's). Returns what became of those still ours: ``"handed_back"`` (queued,
        the attempt not counted), or, for a job the previous stop interrupted too (jobs.sql,
        hand_back_running), ``"retry"`` (queued, counted) or ``"failed"`` (it was the last)."""
        if not jobs:
            return {}
        with self.cursor() as cur:
            cur.execute(
                self.statement("hand_back_running"),
                {"ids": [j[0] for j in jobs], "attempts": [j[1] for j in jobs],
                 "notes": list(notes), "run_seconds": _run_seconds(run_seconds),
                 "started": started},
            )
            return {int(r["id"]): "handed_back" if not r["counted"]
                    else "retry" if r["status"] == "queued" else "failed"
                    for r in cur.fetchall()}

    # -- maintenance ----------------------------------------------------------------------
    def reap_expired(self, limit: int = 1000) -> ReapResult:
        """Return expired leases to the queue (or fail them at max_attempts)."""
        result = self._reap(limit, None)
        assert result is not None
        return result

    def reap_expired_pinned(self, limit: int, stall: float) -> ReapResult | None:
        """``reap_expired`` in a
        transaction whose now(), the time every lease is compared with, was taken while the
        database answered promptly: its first statement (``reap_now``) must come back within
        ``stall`` seconds, else nothing is reaped (None). Alone, a reap a server received just
        before it froze would take its now() after the freeze, and return every lease that
        expired during it (decision 019)."""
        return self._reap(limit, stall)

    def _reap(self, limit: int, stall: float | None) -> ReapResult | None:
        result = ReapResult()
        began = time.monotonic()
        with self.cursor(atomic=stall is not None) as cur:
            if stall is not None:
                cur.execute(self.statement("reap_now"))
                cur.fetchall()
                if time.monotonic() - began > stall:
                    return None
            cur.execute(self.statement("reap_expired"), {"limit": limit})
            for r in cur.fetchall():
                target = result.requeued if r["status"] == "queued" else result.failed
                target[r["queue"]] = target.get(r["queue"], 0) + 1
                result.jobs.append((int(r["id"]), r["queue"], r["tenant"], r["status"]))
        return result

    def wake_due_tenants(self) -> int:
        with self.cursor() as cur:
            cur.execute(self.statement("wake_due_tenants"))
            return len(cur.fetchall())

    def wake_stranded_tenants(self) -> int:
        with self.cursor() as cur:
            cur.execute(self.statement("wake_stranded_tenants"))
            return len(cur.fetchall())

    def repair_schedule(self, limit: int = 1000) -> list[tuple[str, str]]:
        """Make the missing schedule rows of (queue, tenant) pairs with queued jobs (at most
        ``limit``); the pairs repaired."""
        with self.cursor() as cur:
            cur.execute(self.statement("repair_schedule"), {"limit": int(limit)})
            return [(r["queue"], r["tenant"]) for r in cur.fetchall()]

    def rebase_vtime(self, threshold: float = VTIME_REBASE_AT) -> int:
        """Shift the virtual times of queues whose lowest passed ``threshold``; rows changed."""
        with self.cursor() as cur:
            cur.execute(self.statement("rebase_vtime"), {"threshold": float(threshold)})
            return len(cur.fetchall())

    def fold_stale_returns(self, age: float) -> int:
        """Fold the slots given back over ``age`` seconds ago into their tenants' rows (those it
        can lock at once); rows written."""
        with self.cursor() as cur:
            cur.execute(self.statement("fold_stale_returns"), {"age": float(age)})
            row = cur.fetchone()
            return int(row["n"]) if row else 0

    def decay_usage(self, queues: Sequence[str], factor: float) -> int:
        """Keep ``factor`` (in (0, 1]) of each active tenant's lead in virtual time over its
        queue's, in ``queues``; rows changed."""
        with self.cursor() as cur:
            cur.execute(self.statement("decay_usage"),
                        {"queues": list(queues), "factor": float(factor)})
            row = cur.fetchone()
        return 0 if row is None else int(row["n"])

    def vacuum_tenant_schedule(self) -> None:
        """VACUUM the scheduler's hot table (needs its ownership; outside any transaction)."""
        with self.pool.connection() as conn:
            conn.execute(self.statement("vacuum_tenant_schedule"), prepare=False)

    def schedule_vacuum_due(self, min_dead: int, max_age: float) -> bool:
        """Whether tenant_schedule has enough dead rows (or old enough ones) to VACUUM now."""
        with self.cursor() as cur:
            cur.execute(self.statement("schedule_vacuum_due"),
                        {"schema": self.schema, "min_dead": min_dead, "max_age": max_age})
            row = cur.fetchone()
            return bool(row and row["due"])

    def maintenance_due(self, key: str, interval: float) -> bool:
        """True for exactly one caller per ``interval`` seconds and ``key``."""
        with self.cursor() as cur:
            cur.execute(self.statement("maintenance_due"),
                        {"key": f"maintenance:{key}", "interval": interval})
            return cur.fetchone() is not None

    def prune_finished(self, max_age_seconds: float, limit: int = 5000) -> int:
        """Delete finished jobs older than ``max_age_seconds`` in batches; returns how many."""
        total = 0
        while True:
            with self.cursor() as cur:
                cur.execute(self.statement("prune_finished"), {"max_age": max_age_seconds, "limit": limit})
                n = cur.rowcount
            total += max(n, 0)
            if n < limit:
                return total

    def runnable_exists(self, queues: Sequence[str]) -> bool:
        with self.cursor() as cur:
            cur.execute(self.statement("runnable_count"), {"queues": list(queues)})
            row = cur.fetchone()
            return bool(row and row["n"])

    def held_running(self, worker: str) -> tuple[int, float]:
        """How many jobs run under ``worker``'s leases, and seconds until the first expires."""
        with self.cursor() as cur:
            cur.execute(self.statement("held_running"), {"worker": worker})
            row = cur.fetchone()
        return (0, 0.0) if not row or not row["n"] else (int(row["n"]), float(row["seconds"]))

    # -- periodic schedules ---------------------------------------------------------------
    def periodic_state(self, keys: Sequence[tuple[str, str]]
                       ) -> tuple[datetime, dict[tuple[str, str], datetime | None]]:
        """The database clock and the last tick enqueued of each (name, tenant) schedule."""
        with self.cursor() as cur:
            cur.execute(self.statement("periodic_state"),
                        {"names": [k[0] for k in keys], "tenants": [k[1] for k in keys]})
            rows = cur.fetchall()
        return rows[0]["now"], {(r["name"], r["tenant"]): r["last_tick"]
                                for r in rows if r["name"] is not None}

    def periodic_register(self, name: str, tenant: str, task: str, cron: str,
                          tick: datetime) -> bool:
        """Record a new schedule as having had ``tick``; False if it already existed."""
        with self.cursor() as cur:
            cur.execute(self.statement("periodic_register"),
                        {"name": name, "tenant": tenant, "task": task, "cron": cron, "tick": tick})
            return cur.fetchone() is not None

    def periodic_fire(self, name: str, tenant: str, cron: str, tick: datetime,
                      job: NewJob) -> int | None:
        """Claim ``tick`` of a schedule and enqueue its job, in one transaction; the job's id,
        or None when the tick was not ours (already enqueued, or not later than the last)."""
        key = {"name": name, "tenant": tenant}
        with self.cursor(atomic=True) as cur:
            cur.execute(self.statement("periodic_claim"),
                        {**key, "task": job.task, "cron": cron, "tick": tick})
            if cur.fetchone() is None:
                return None
            job_id = self._enqueue_chunk(cur, NewJobColumns.of([job]))[0]
            cur.execute(self.statement("periodic_set_job"), {**key, "job_id": job_id})
        return job_id

    def periodic_list(self) -> tuple[datetime, list[dict[str, Any]]]:
        """The database clock and every row of the periodic table."""
        with self.cursor() as cur:
            cur.execute(self.statement("periodic_list"))
            rows = cur.fetchall()
        return rows[0]["now"], [r for r in rows if r["name"] is not None]

    # -- jobs -----------------------------------------------------------------------------
    def cancel(self, job_id: int) -> bool:
        with self.cursor() as cur:
            cur.execute(self.statement("cancel"), {"id": job_id})
            return cur.fetchone() is not None

    def get_job(self, job_id: int) -> JobInfo | None:
        with self.cursor() as cur:
            cur.execute(self.statement("get_job"), {"id": job_id})
            row = cur.fetchone()
        return JobInfo(**row) if row else None

    def job_trace(self, job_id: int) -> TraceContext | None:
        """The trace context stored with the job's enqueue (fairq.otel); None: untraced."""
        with self.cursor() as cur:
            cur.execute(self.statement("get_job_trace"), {"id": job_id})
            row = cur.fetchone()
        return TraceContext(row["traceparent"], row["tracestate"]) if row else None


_CLAIMED = {f.name for f in fields(ClaimedJob)}


def _enqueued_ids(row: Any) -> list[int]:
    """The ids of the ``enqueue`` statement's one row (a tuple or a dict row)."""
    if row is None:
        return []
    ids = row[0] if isinstance(row, tuple) else row["ids"]
    return list(ids or [])


def _claimed(row: dict[str, Any]) -> ClaimedJob:
    # The payload is decoded already (jsonb, see load_json): a str payload is a JSON string,
    # never to be decoded again.
    return ClaimedJob(**{k: row[k] for k in _CLAIMED})


def _run_seconds(run_seconds: Sequence[float] | None) -> list[float] | None:
    """Measured run times as the finishes take them: never negative (a clock step)."""
    return None if run_seconds is None else [max(0.0, float(r)) for r in run_seconds]

