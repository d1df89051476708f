"""PostgreSQL store: runs fairq's named statements through a psycopg connection pool.

Every method is one short transaction (autocommit, or the caller's own transaction for
enqueue), so no transaction stays open while a handler runs. Every statement runs under
``lock_timeout`` and ``statement_timeout`` so one stuck session cannot stall every worker.

On a direct connection the timeouts are session settings given at connect time, so a claim or a
finish is one round trip (a single autocommit statement). Behind a transaction-mode pooler
(``pooler=True``) session state does not stick to a server connection, so each operation runs
in an explicit transaction that sets them with ``SET LOCAL`` semantics (four round trips).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.abc import Buffer
from psycopg.rows import dict_row
from psycopg.types.datetime import TimestamptzLoader
from psycopg.types.json import set_json_loads
from psycopg_pool import ConnectionPool

from fairq import sql
from fairq.config import redact
from fairq.models import (
    ClaimedJob,
    ClaimPlan,
    FinishedJob,
    GroupConfig,
    JobInfo,
    NewJob,
    NewJobColumns,
    ReapResult,
    TenantConfig,
    TenantDefaults,
    UndecodablePayload,
)

log = logging.getLogger("fairq.store")

CHUNK = 5000  # jobs per enqueue round trip
# fairq's statements are planned once: their generic plans have the same guarded shapes
# (tests/integration/test_claim_plans.py) and skip the 1-2 ms of planning a custom plan costs per claim.
PLAN_CACHE_MODE = "force_generic_plan"
# ...and those plans must not depend on row estimates a generic plan cannot have (how many
# rows a CTE yields, how big the hot tenant_schedule was when the plan was cached): every fairq
# statement joins a batch-sized set to an indexed table, so nested loops over index probes are
# always right, while a hash or merge join, or a seq scan, reads the whole table. (fairq stats,
# which aggregates whole tables, restores the defaults in its transaction; the exporter and the
# probe use connections of their own.)
# JIT off too: its compile time (tens of ms) dwarfs a 1 ms claim, and the disabled paths'
# cost penalties would otherwise push a plan's estimate over jit_above_cost.
# Bitmap scans off too: a bitmap scan returns rows in no order, so a walk of the runnable index
# in (vtime, tenant) order became "read every runnable tenant, then sort" whenever the planner
# misjudged how far the walk goes (100,000 tenants: 5,725 buffers, 0.7 s per claim); a plain
# index scan gives the order and stops with the walk.
# Sorts off too, for the same walk: with tenant_schedule analyzed while it held one row, then
# hundreds of tenants enqueued (statistics are stale after every burst), the planner found
# "read the queue's tenants by primary key, then sort" as cheap as the runnable index, and each
# fair claim read every tenant of the queue (704 rows in test_plan_states' analyzed_one_tenant).
# A sort that has no alternative (a batch's rows, a CTE's few) still runs. What the setting
# asks of the statements: a set of rows locked in key order is its few keys sorted, then each
# row locked by its key (the finishes and the reaper, fairq/sql/jobs.sql; the SQL enqueue,
# enqueue_v2.sql; retry and rebase), never a join ordered by a table's key, which the planner
# would read whole in that order rather than sort a handful (one job enqueued among 20,000
# tenants read 344 buffers in 14 ms that way, against 22 in 1 ms); and no "ORDER BY id LIMIT"
# over a filtered set (cancel_tenant asks for no order). Every named statement's generic plan
# was compared with sorts on and off in the plan-test states: the others differ only in a hash
# aggregate where a sort and group were.
PLANNER_SETTINGS = {"enable_seqscan": "off", "enable_hashjoin": "off", "enable_mergejoin": "off",
                    "enable_bitmapscan": "off", "enable_sort": "off", "jit": "off"}
# Virtual time is rebased once a queue's lowest active vtime passes 2^20: below 2^21 a float8's
# resolution is 2^-32, so even the smallest increment (1 / 1000, a weight of 1000) is kept to
# within 2e-7 of its value, however many claims a queue has served.
VTIME_REBASE_AT = float(2 ** 20)


def load_json(data: bytes | str) -> Any:
    """psycopg's json/jsonb loader for fairq's connections: a payload Python cannot decode
    (nested past its recursion limit, written by hand in SQL) becomes an ``UndecodablePayload``
    instead of an error that would take the whole fetched batch of jobs with it."""
    try:
        return json.loads(data)
    except (RecursionError, ValueError, MemoryError) as exc:
        return UndecodablePayload(f"{type(exc).__name__}: {str(exc)[:200]}")


class _TimestamptzLoader(TimestamptzLoader):
    """``infinity`` and ``-infinity`` (valid in PostgreSQL, not in Python) as datetime's max
    and min, so that a job whose run_at was set to infinity in SQL can still be read.

    Subclassing psycopg's loader gives its pure-Python parser even where psycopg's C one is
    installed (a claimed job carries three timestamps: 2.3 us each here, about 11% of a no-op
    worker's GIL time in a py-spy profile). ISO text (PostgreSQL's default DateStyle) is parsed
    by ``datetime.fromisoformat`` (C) in the connection's time zone, as psycopg returns it;
    anything else (another DateStyle, BC dates) goes to psycopg's parser as before.
    """

    def load(self, data: Buffer) -> datetime:
        if data == b"infinity":
            return datetime.max.replace(tzinfo=UTC)
        if data == b"-infinity":
            return datetime.min.replace(tzinfo=UTC)
        try:
            parsed = datetime.fromisoformat(bytes(data).decode("ascii"))
            if parsed.tzinfo is not None:  # else not a timestamptz in ISO style: psycopg decides
                return parsed.astimezone(self._timezone)
        except (ValueError, OverflowError):  # not ISO, or past datetime's range: psycopg decides
            pass
        return super().load(data)


def adapt_connection(conn: psycopg.Connection[Any]) -> None:
    """Register fairq's loaders (above) on ``conn``."""
    set_json_loads(load_json, conn)
    conn.adapters.register_loader("timestamptz", _TimestamptzLoader)


def planner_options() -> str:
    """The libpq ``options`` that give a session fairq's planner settings (tests explain with it)."""
    settings = {"plan_cache_mode": PLAN_CACHE_MODE, **PLANNER_SETTINGS}
    return " ".join(f"-c {k}={v}" for k, v in settings.items())


def _shared(column: Sequence[Any]) -> list[Any]:
    """``[value]`` if every element of ``column`` is ``value``, else the whole column as a list."""
    values = list(column)
    return values[:1] if values and values.count(values[0]) == len(values) else values


def enqueue_params(jobs: NewJobColumns) -> dict[str, Any]:
    """The ``enqueue`` statement's parameters for one chunk (the sync and async stores').

    The arrays go in binary (the statement's %(name)b): no text quoting of 5,000 payloads.
    A binary array must be of one Python type, hence the float() of costs and delays.
    A column whose jobs all share one value goes as that one value (see the statement).
    """
    return {
        "queues": _shared(jobs.queues),
        "tenants": jobs.tenants,
        "tasks": _shared(jobs.tasks),
        "payloads": jobs.payloads_json,
        "priorities": _shared(jobs.priorities),
        "costs": [float(c) for c in _shared(jobs.costs)],
        "run_ats": _shared(jobs.run_ats),
        "max_attempts": _shared(jobs.max_attempts),
        "leases": _shared(jobs.lease_seconds),
        "delays": [None if d is None else float(d) for d in _shared(jobs.delays)],
        "keys": _shared(jobs.keys) if jobs.keys else None,
    }


def channel_for(schema: str) -> str:
    """The LISTEN/NOTIFY channel of a schema: wake-ups carry the queue name only."""
    return f"fairq_{schema}"


def connection_for(obj: Any) -> psycopg.Connection[Any]:
    """The psycopg connection behind a psycopg, SQLAlchemy Connection or SQLAlchemy Session.

    Writing through it makes the job commit or roll back with the caller's transaction.
    """
    if isinstance(obj, psycopg.Connection):
        return obj
    import inspect

    if isinstance(obj, psycopg.AsyncConnection) or any(
            inspect.iscoroutinefunction(getattr(type(obj), m, None))
            for m in ("connection", "get_raw_connection")):
        from fairq.errors import InvalidInput

        raise InvalidInput(f"connection= is async ({type(obj).__name__}): await the async "
                           "methods instead (enqueue_async, enqueue_many_async)")
    get_conn = getattr(obj, "connection", None)
    if callable(get_conn):  # SQLAlchemy Session: .connection() -> Connection (in its transaction)
        obj = get_conn()
    in_tx = getattr(obj, "in_transaction", None)
    if callable(in_tx) and not in_tx():
        # A SQLAlchemy Connection only commits what it knows it began: begin now so the
        # caller's conn.commit() / conn.rollback() covers the job we write underneath.
        obj.begin()
    raw = getattr(obj, "connection", None)  # SQLAlchemy Connection -> PoolProxiedConnection
    dbapi = getattr(raw, "dbapi_connection", None)
    if isinstance(dbapi, psycopg.Connection):
        return dbapi
    from fairq.errors import InvalidInput

    driver = type(dbapi).__module__.split(".")[0] if dbapi is not None else None
    if driver is not None and driver != "psycopg":
        # A plain postgresql:// URL gives SQLAlchemy's default driver, psycopg2.
        raise InvalidInput(
            f"connection= needs SQLAlchemy's psycopg (3) driver, not {driver}: create the engine "
            "with a postgresql+psycopg:// URL (fairq.config.sqlalchemy_url(dsn) makes one)"
        )
    raise InvalidInput(
        "connection= takes a psycopg Connection, a SQLAlchemy Connection or a SQLAlchemy "
        f"Session using the psycopg driver, not {type(obj).__name__}"
    )


# The SQLSTATE of the SQL enqueue's checks (fairq/sql/ddl/enqueue_v2.sql): the same refusals
# as fairq.validation, for every client.
INVALID_INPUT_SQLSTATE = "FQ001"


def _invalid_input(exc: psycopg.Error) -> Exception:
    """The SQL enqueue's refusal as ``InvalidInput`` (one line); any other error as it is."""
    from fairq.errors import InvalidInput

    if exc.sqlstate != INVALID_INPUT_SQLSTATE:
        return exc
    message = exc.diag.message_primary or str(exc)
    return InvalidInput(message.removeprefix("fairq: "))


class Store:
    """fairq's database operations on one schema."""

    def __init__(
        self,
        dsn: str,
        schema: str,
        *,
        min_size: int = 1,
        max_size: int = 4,
        statement_timeout_ms: int = 30_000,
        lock_timeout_ms: int = 5_000,
        prepare_threshold: int | None = 5,
        open_pool: bool = True,
        application_name: str = "fairq",
        timeout: float = 30.0,
        pooler: bool = False,
        durable_commits: bool = True,
    ) -> None:
        self.dsn = dsn
        self.schema = schema
        self.channel = channel_for(schema)
        self.statement_timeout_ms = statement_timeout_ms
        self.lock_timeout_ms = lock_timeout_ms
        self._prepare_threshold = prepare_threshold
        self.application_name = application_name[:63]
        self.pooler = pooler
        # Off only for writes a crash may undo without losing a job (the worker's finishes: an
        # undone finish leaves the job running under its lease, and the reaper runs it again).
        # Durable: whatever the server or role says (it may be remote_apply for a replica).
        self.synchronous_commit: str | None = None if durable_commits else "off"
        kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": prepare_threshold}
        if not pooler:
            kwargs["options"] = (f"-c statement_timeout={int(statement_timeout_ms)} "
                                 f"-c lock_timeout={int(lock_timeout_ms)} " + planner_options())
            if not durable_commits:
                kwargs["options"] += " -c synchronous_commit=off"
        self.pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            kwargs=kwargs,
            configure=self._configure,
            open=False,
            timeout=timeout,
            name=f"fairq-{schema}",
        )
        if open_pool:
            self.pool.open(wait=False)

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        adapt_connection(conn)
        # Behind a pooler this lands on whichever server connection serves it: cosmetic there.
        conn.execute(self.q("label_session"), {"name": self.application_name})

    def close(self) -> None:
        self.pool.close()

    def describe(self) -> str:
        return f"{redact(self.dsn)} schema={self.schema}"

    def q(self, name: str) -> str:
        """The named statement for this store's schema."""
        return sql.statement(name, self.schema)

    @contextmanager
    def _tx(self, *, atomic: bool = False,
            raw: bool = False) -> Iterator[psycopg.Cursor[dict[str, Any]]]:
        """A dict-row cursor under the store's timeouts.

        Without ``atomic`` each statement is its own transaction: callers that run one statement
        (claims, finishes) pay one round trip. ``atomic`` wraps several statements in one.
        ``raw``: a RawCursor, for statements in positional form (``sql.positional``).
        """
        factory = psycopg.RawCursor if raw else psycopg.Cursor
        with self.pool.connection() as conn:
            if not self.pooler and not atomic:
                with factory(conn, row_factory=dict_row) as cur:
                    yield cur
                return
            with conn.transaction(), factory(conn, row_factory=dict_row) as cur:
                if self.pooler:
                    conn.execute(self.q("transaction_settings"), {
                        "statement_timeout": str(self.statement_timeout_ms),
                        "lock_timeout": str(self.lock_timeout_ms),
                        "synchronous_commit": self.synchronous_commit,
                        "plan_cache_mode": PLAN_CACHE_MODE, **PLANNER_SETTINGS})
                yield cur

    # -- producers ----------------------------------------------------------------------
    def enqueue(self, jobs: Sequence[NewJob] | NewJobColumns, connection: Any = None) -> list[int]:
        """Insert ``jobs`` (one round trip per chunk); in ``connection``'s transaction if given."""
        cols = jobs if isinstance(jobs, NewJobColumns) else NewJobColumns.of(jobs)
        ids: list[int] = []
        if connection is not None:
            conn = connection_for(connection)
            with conn.cursor() as cur:
                for start in range(0, len(cols), CHUNK):
                    ids.extend(self._enqueue_chunk(cur, cols.chunk(start, start + CHUNK)))
            return ids
        # All chunks or none; the timeouts apply too: a locked table must not hang producers.
        with self._tx(atomic=len(cols) > CHUNK) as cur:
            for start in range(0, len(cols), CHUNK):
                ids.extend(self._enqueue_chunk(cur, cols.chunk(start, start + CHUNK)))
        return ids

    def _enqueue_chunk(self, cur: psycopg.Cursor[Any], jobs: NewJobColumns) -> list[int]:
        try:
            cur.execute(self.q("enqueue"), enqueue_params(jobs))
        except psycopg.Error as exc:
            raise _invalid_input(exc) from None
        row = cur.fetchone()
        if row is None:
            return []
        first = row[0] if isinstance(row, tuple) else row["ids"]
        return list(first or [])

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
        with self._tx() as cur:
            cur.execute(self.q("next_wake"), {"queue": queue})
            row = cur.fetchone()
        return None if row is None else float(row["seconds"])

    def next_token(self, queues: Sequence[str]) -> float | None:
        """Seconds until the first rate-limited tenant of ``queues`` with a due job and a free
        slot has its next token (0 if it has one now); None when no due job waits for a token."""
        with self._tx() as cur:
            cur.execute(self.q("next_token"), {"queues": list(queues)})
            row = cur.fetchone()
        return None if row is None else float(row["seconds"])

    def _claim_rows(self, statement: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        # Positional and raw: psycopg does not parse the claim's text, whatever its length
        # (psycopg caches its parse of texts up to 4 KiB only; fairq/sql/__init__.py).
        stmt = sql.positional(statement, self.schema)
        with self._tx(raw=True) as cur:
            cur.execute(stmt.text, stmt.values(params))
            return cur.fetchall()

    def finish_done(self, done: Sequence[tuple[int, int]],
                    results: Sequence[str | None] | None = None,
                    notes: Sequence[str | None] | None = None) -> list[FinishedJob]:
        """Mark (id, attempts) pairs done; returns those that were still ours. ``results``
        (JSON texts) and ``notes`` (why a result was not stored), if given, go with ``done``."""
        if not done:
            return []
        with self._tx() as cur:
            cur.execute(
                self.q("finish_done"),
                {"ids": [d[0] for d in done], "attempts": [d[1] for d in done],
                 # a NULL array, not one of NULLs, when the batch has none (the common case)
                 "results": list(results) if results and any(r is not None for r in results)
                 else None,
                 "notes": list(notes) if notes and any(n is not None for n in notes) else None},
            )
            return [FinishedJob(status="done", **r) for r in cur.fetchall()]

    def finish_failed(
        self, failures: Sequence[tuple[int, int, str, float | None]], final: Sequence[int] = ()
    ) -> list[FinishedJob]:
        """Record (id, attempts, error, retry_delay or None for the backoff) failures; the ids
        in ``final`` fail for good, whatever attempts they have left."""
        if not failures:
            return []
        with self._tx() as cur:
            cur.execute(
                self.q("finish_failed"),
                {
                    "ids": [f[0] for f in failures],
                    "attempts": [f[1] for f in failures],
                    "errors": [f[2] for f in failures],
                    "retry_delays": [f[3] for f in failures],
                    "final": list(final),
                },
            )
            return [FinishedJob(**r) for r in cur.fetchall()]

    def extend_leases(
        self, jobs: Sequence[tuple[int, int]], seconds: float | None = None
    ) -> set[int]:
        """Extend the leases of (id, attempts) pairs; returns the ids still ours."""
        if not jobs:
            return set()
        with self._tx() as cur:
            cur.execute(
                self.q("extend_leases"),
                {"ids": [j[0] for j in jobs], "attempts": [j[1] for j in jobs], "seconds": seconds},
            )
            return {int(r["id"]) for r in cur.fetchall()}

    def release_unstarted(self, jobs: Sequence[tuple[int, int]]) -> set[int]:
        """Hand back claimed but unstarted (id, attempts) jobs; returns the ids released."""
        if not jobs:
            return set()
        with self._tx() as cur:
            cur.execute(
                self.q("release_unstarted"),
                {"ids": [j[0] for j in jobs], "attempts": [j[1] for j in jobs]},
            )
            return {int(r["id"]) for r in cur.fetchall()}

    # -- maintenance ----------------------------------------------------------------------
    def reap_expired(self, limit: int = 1000) -> ReapResult:
        """Return expired leases to the queue (or fail them at max_attempts)."""
        result = ReapResult()
        with self._tx() as cur:
            cur.execute(self.q("reap_expired"), {"limit": limit})
            for r in cur.fetchall():
                target = result.requeued if r["status"] == "queued" else result.failed
                target[r["queue"]] = target.get(r["queue"], 0) + 1
        return result

    def wake_due_tenants(self) -> int:
        with self._tx() as cur:
            cur.execute(self.q("wake_due_tenants"))
            return len(cur.fetchall())

    def wake_stranded_tenants(self) -> int:
        with self._tx() as cur:
            cur.execute(self.q("wake_stranded_tenants"))
            return len(cur.fetchall())

    def rebase_vtime(self, threshold: float = VTIME_REBASE_AT) -> int:
        """Shift the virtual times of queues whose lowest passed ``threshold``; rows changed."""
        with self._tx() as cur:
            cur.execute(self.q("rebase_vtime"), {"threshold": float(threshold)})
            return len(cur.fetchall())

    def vacuum_tenant_schedule(self) -> None:
        """VACUUM the scheduler's hot table (needs its ownership; outside any transaction)."""
        with self.pool.connection() as conn:
            conn.execute(self.q("vacuum_tenant_schedule"), prepare=False)

    def schedule_vacuum_due(self, min_dead: int, max_age: float) -> bool:
        """Whether tenant_schedule has enough dead rows (or old enough ones) to VACUUM now."""
        with self._tx() as cur:
            cur.execute(self.q("schedule_vacuum_due"),
                        {"schema": self.schema, "min_dead": min_dead, "max_age": max_age})
            row = cur.fetchone()
            return bool(row and row["due"])

    def maintenance_due(self, key: str, interval: float) -> bool:
        """True for exactly one caller per ``interval`` seconds and ``key``."""
        with self._tx() as cur:
            cur.execute(self.q("maintenance_due"), {"key": f"maintenance:{key}", "interval": interval})
            return cur.fetchone() is not None

    def prune_finished(self, max_age_seconds: float, limit: int = 5000) -> int:
        """Delete finished jobs older than ``max_age_seconds`` in batches; returns how many."""
        total = 0
        while True:
            with self._tx() as cur:
                cur.execute(self.q("prune_finished"), {"max_age": max_age_seconds, "limit": limit})
                n = cur.rowcount
            total += max(n, 0)
            if n < limit:
                return total

    def runnable_exists(self, queues: Sequence[str]) -> bool:
        with self._tx() as cur:
            cur.execute(self.q("runnable_count"), {"queues": list(queues)})
            row = cur.fetchone()
            return bool(row and row["n"])

    # -- periodic schedules ---------------------------------------------------------------
    def periodic_state(self, keys: Sequence[tuple[str, str]]
                       ) -> tuple[datetime, dict[tuple[str, str], datetime | None]]:
        """The database clock and the last tick enqueued of each (name, tenant) schedule."""
        with self._tx() as cur:
            cur.execute(self.q("periodic_state"),
                        {"names": [k[0] for k in keys], "tenants": [k[1] for k in keys]})
            rows = cur.fetchall()
        return rows[0]["now"], {(r["name"], r["tenant"]): r["last_tick"]
                                for r in rows if r["name"] is not None}

    def periodic_register(self, name: str, tenant: str, task: str, cron: str,
                          tick: datetime) -> bool:
        """Record a new schedule as having had ``tick``; False if it already existed."""
        with self._tx() as cur:
            cur.execute(self.q("periodic_register"),
                        {"name": name, "tenant": tenant, "task": task, "cron": cron, "tick": tick})
            return cur.fetchone() is not None

    def periodic_fire(self, name: str, tenant: str, cron: str, tick: datetime,
                      job: NewJob) -> int | None:
        """Claim ``tick`` of a schedule and enqueue its job, in one transaction; the job's id,
        or None when the tick was not ours (already enqueued, or not later than the last)."""
        key = {"name": name, "tenant": tenant}
        with self._tx(atomic=True) as cur:
            cur.execute(self.q("periodic_claim"),
                        {**key, "task": job.task, "cron": cron, "tick": tick})
            if cur.fetchone() is None:
                return None
            job_id = self._enqueue_chunk(cur, NewJobColumns.of([job]))[0]
            cur.execute(self.q("periodic_set_job"), {**key, "job_id": job_id})
        return job_id

    def periodic_list(self) -> tuple[datetime, list[dict[str, Any]]]:
        """The database clock and every row of the periodic table."""
        with self._tx() as cur:
            cur.execute(self.q("periodic_list"))
            rows = cur.fetchall()
        return rows[0]["now"], [r for r in rows if r["name"] is not None]

    # -- jobs -----------------------------------------------------------------------------
    def cancel(self, job_id: int) -> bool:
        with self._tx() as cur:
            cur.execute(self.q("cancel"), {"id": job_id})
            return cur.fetchone() is not None

    def get_job(self, job_id: int) -> JobInfo | None:
        with self._tx() as cur:
            cur.execute(self.q("get_job"), {"id": job_id})
            row = cur.fetchone()
        return JobInfo(**row) if row else None

    # -- tenants --------------------------------------------------------------------------
    def get_defaults(self) -> tuple[float, int]:
        weight, max_running, _, _ = self.get_tenant_defaults()
        return (weight, max_running)

    def get_tenant_defaults(self) -> TenantDefaults:
        """(weight, max_running, rate, burst) of tenants without their own configuration."""
        with self._tx() as cur:
            cur.execute(self.q("get_defaults"))
            row = cur.fetchone()
        if row is None:
            return (1.0, 10, None, None)
        return (float(row["weight"]), int(row["max_running"]), row["rate"], row["burst"])

    def set_tenants(
        self,
        tenants: Sequence[TenantConfig],
        defaults: tuple[float, int] | TenantDefaults | None = None,
        groups: Sequence[GroupConfig] = (),
    ) -> None:
        """Write tenants' configuration (and optionally new defaults) in one transaction.
        ``defaults`` is (weight, max_running) or (weight, max_running, rate, burst); the short
        form means no rate limit."""
        with self._tx(atomic=True) as cur:
            for g in groups:
                cur.execute(self.q("upsert_group"), {"group": g.name, "weight": g.weight})
            if groups:
                cur.execute(self.q("expire_group_factors"))
            if defaults is not None:
                rate, burst = (defaults[2], defaults[3]) if len(defaults) == 4 else (None, None)
                d = {"weight": defaults[0], "max_running": defaults[1], "rate": rate,
                     "burst": burst}
                cur.execute(self.q("set_defaults"), d)
            for t in sorted(tenants, key=lambda t: t.tenant):
                p = {"tenant": t.tenant, "weight": t.weight, "max_running": t.max_running,
                     "rate": t.rate, "burst": t.burst, "group": t.group}
                cur.execute(self.q("upsert_tenant"), p)
                cur.execute(self.q("sync_tenant_schedule"), p)
            if defaults is not None:
                cur.execute(self.q("sync_default_tenants"), d)

    def set_group(self, group: GroupConfig) -> None:
        """Create or reweigh a tenant group; every queue's next claim recomputes the factors."""
        with self._tx(atomic=True) as cur:
            cur.execute(self.q("upsert_group"), {"group": group.name, "weight": group.weight})
            cur.execute(self.q("expire_group_factors"))

    def list_groups(self) -> list[GroupConfig]:
        with self._tx() as cur:
            cur.execute(self.q("list_groups"))
            return [GroupConfig(**r) for r in cur.fetchall()]

    def get_tenant(self, tenant: str) -> TenantConfig:
        with self._tx() as cur:
            cur.execute(self.q("get_tenant"), {"tenant": tenant})
            row = cur.fetchone()
        if row is not None:
            return TenantConfig(**row)
        weight, max_running, rate, burst = self.get_tenant_defaults()
        return TenantConfig(tenant, weight, max_running, configured=False, rate=rate, burst=burst)

    def list_tenants(self) -> list[TenantConfig]:
        with self._tx() as cur:
            cur.execute(self.q("list_tenants"))
            return [TenantConfig(**r) for r in cur.fetchall()]


_CLAIMED = {f.name for f in fields(ClaimedJob)}


def _claimed(row: dict[str, Any]) -> ClaimedJob:
    # The payload is decoded already (jsonb, see load_json): a str payload is a JSON string,
    # never to be decoded again.
    return ClaimedJob(**{k: row[k] for k in _CLAIMED})
