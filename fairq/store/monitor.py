"""The store's monitoring part: the database reads of ``fairq stats``, the exporter, the claim
probe and the health checks.

None of them runs on the workers' hot path. ``fairq stats`` borrows a connection of the app's
pool for one bounded read-only transaction; the exporter and the probe each hold one dedicated
autocommit connection (``MonitorSession``), opened at scrape time and again after it broke, so
their session state (the probe's prepared statement, the planner's defaults) never reaches a
worker's session. What the numbers mean (metric families, totals, which policy a statement
belongs to) stays with the callers: this module only reads.
"""

from __future__ import annotations

import math
import re
from typing import Any

import psycopg
from psycopg import sql as pgsql
from psycopg.rows import dict_row

from fairq import sql
from fairq.store.pg import Store
from fairq.store.planner import PLAN_CACHE_MODE, PLANNER_SETTINGS
from fairq.store.workers import MISSED_BEATS

# PostgreSQL types of the claim statements' parameters, for PREPARE.
PARAM_TYPES = {"queue": "text", "worker": "text", "batch": "int4", "window": "float8", "wait": "bool",
               "by_weight": "bool", "by_cost": "bool", "by_time": "bool"}
_PARAM = re.compile(r"%\((\w+)\)s")
# Statements that name no schema render the same for any: health checks know no schema.
_ANY_SCHEMA = "public"


def statement_prefix(name: str, schema: str) -> str:
    """The text of a named statement up to its first parameter: what pg_stat_statements keeps."""
    text = sql.statement(name, schema)
    m = _PARAM.search(text)
    return text[: m.start()] if m else text


def to_prepare(name: str, schema: str) -> tuple[str, list[str]]:
    """The statement with ``$n`` placeholders, and the parameter names in ``$n`` order."""
    stmt = sql.positional(name, schema)
    return stmt.text, list(stmt.names)


def waits_params(queue: str | None, tenant: str | None) -> dict[str, Any]:
    """The parameters of ``tenant_waits``: the queue and tenant asked about (None: every one)."""
    return {"queue": queue, "tenant": tenant, "missed_beats": float(MISSED_BEATS)}


def read_waits(conn: psycopg.Connection[Any], schema: str,
               queue: str | None, tenant: str | None) -> list[dict[str, Any]]:
    """``tenant_waits`` in positional form on a raw cursor: over 4 KiB for long schema names,
    psycopg would parse its text again at every call (as the claims, fairq/store/pg.py)."""
    stmt = sql.positional("tenant_waits", schema)
    with psycopg.RawCursor(conn, row_factory=dict_row) as cur:
        cur.execute(stmt.text, stmt.values(waits_params(queue, tenant)))
        return cur.fetchall()


def tenant_stats(store: Store, *, window_s: float, queue: str | None,
                 timeout_ms: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``fairq stats``'s rows and each (queue, tenant)'s reason (``tenant_waits``), read in one
    bounded, read-only transaction (with the planner's defaults back: it aggregates whole
    tables)."""
    params: dict[str, Any] = {"window": float(window_s), "queue": queue}
    with store.pool.connection() as conn, conn.transaction(), \
            conn.cursor(row_factory=dict_row) as cur:
        cur.execute(store.statement("stats_timeouts"), {"timeout_ms": str(timeout_ms)})
        cur.execute(store.statement("tenant_stats"), params)
        stats = cur.fetchall()
        return stats, read_waits(conn, store.schema, queue, None)


def tenant_waits(store: Store, *, queue: str | None, tenant: str | None,
                 timeout_ms: int) -> list[dict[str, Any]]:
    """Why each (queue, tenant) asked about waits (``fairq/sql/explain.sql``), read in one
    bounded, read-only transaction with the planner's defaults back."""
    with store.pool.connection() as conn, conn.transaction(), \
            conn.cursor(row_factory=dict_row) as cur:
        cur.execute(store.statement("stats_timeouts"), {"timeout_ms": str(timeout_ms)})
        return read_waits(conn, store.schema, queue, tenant)


_STATEMENT_NOTE = "fairq statement: "


def failed_statement(error: BaseException) -> str | None:
    """The named statement a ``MonitorSession`` read failed in (None: not one of its reads)."""
    for note in getattr(error, "__notes__", ()):
        if isinstance(note, str) and note.startswith(_STATEMENT_NOTE):
            return note[len(_STATEMENT_NOTE):]
    return None


def ping(dsn: str, timeout: float = 2.0) -> None:
    """Connect and run ``SELECT 1``; raises the driver's error when the database does not answer.
    A fresh connection each time: a health check must not trust a pooled one."""
    with psycopg.connect(dsn, connect_timeout=max(1, math.ceil(timeout)), autocommit=True) as conn:
        conn.execute(sql.statement("ping", _ANY_SCHEMA))


class MonitorSession:
    """One dedicated autocommit connection of a scrape-time reader (the exporter, the probe).

    Opened by ``connect()`` (each read connects if needed), closed by ``close()``; after a failed
    read the caller hands the error to ``recover()``, which drops the connection only when it
    cannot be trusted any more.
    """

    def __init__(self, dsn: str, schema: str, *, application_name: str,
                 connect_timeout: int = 5) -> None:
        self.dsn, self.schema = dsn, schema
        self.application_name = application_name[:63]
        self.connect_timeout = connect_timeout
        self._conn: psycopg.Connection[Any] | None = None
        self._prepared: set[str] = set()  # this session's prepared statements

    def statement(self, name: str) -> str:
        """The text of the named statement ``name`` for this session's schema."""
        return sql.statement(name, self.schema)

    def connect(self) -> bool:
        """Open the connection unless it is open; True when this call opened it (a new session:
        nothing prepared, settings at their defaults)."""
        if self._conn is not None and not self._conn.closed and not self._conn.broken:
            return False
        self._conn = psycopg.connect(self.dsn, autocommit=True,
                                     connect_timeout=self.connect_timeout,
                                     application_name=self.application_name)
        self._prepared.clear()
        return True

    def _session(self) -> psycopg.Connection[Any]:
        self.connect()
        assert self._conn is not None
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def recover(self, error: BaseException) -> None:
        """After a failed read: drop the connection when it broke, or when the failure was not
        the database's (the session's state is then unknown); a statement that failed, such as
        a timeout, leaves it usable."""
        conn = self._conn
        if conn is not None and (conn.closed or conn.broken
                                 or not isinstance(error, psycopg.Error)):
            self.close()

    # -- the exporter --------------------------------------------------------------------------
    def exporter_snapshot(self, timeout_ms: int) -> tuple[
            list[dict[str, Any]], dict[str, int], dict[str, Any] | None, dict[tuple[str, str], int]]:
        """One consistent read for the exporter, under ``timeout_ms`` (statement and lock):
        the rows of ``exporter_tenants``, unreaped expired leases per queue, the jobs table's
        statistics (None when PostgreSQL has none), and how many tenants of each queue wait for
        each reason (``tenant_waits``, one set-based read; tenants without jobs not counted)."""
        conn = self._session()
        name = "metrics_timeouts"
        reasons: dict[tuple[str, str], int] = {}
        try:
            with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
                cur.execute(self.statement(name),
                            {"statement_ms": str(timeout_ms), "lock_ms": str(timeout_ms)})
                name = "exporter_tenants"
                cur.execute(self.statement(name))
                tenants = cur.fetchall()
                name = "exporter_expired_leases"
                cur.execute(self.statement(name))
                leases = {r["queue"]: int(r["expired"]) for r in cur.fetchall()}
                name = "exporter_jobs_table"
                cur.execute(self.statement(name), {"schema": self.schema})
                table = cur.fetchone()
                name = "tenant_waits"
                for r in read_waits(conn, self.schema, None, None):
                    if r["reason"] != "no_jobs":
                        key = (r["queue"], r["reason"])
                        reasons[key] = reasons.get(key, 0) + 1
        except psycopg.Error as exc:
            exc.add_note(f"{_STATEMENT_NOTE}{name}")  # which read failed (a timeout, say)
            raise
        return tenants, leases, table, reasons

    # -- the claim probe: pg_stat_statements ------------------------------------------------------
    def pgss_status(self) -> tuple[bool, str, str]:
        """(created in this database, shared_preload_libraries, track_planning)."""
        row = self._session().execute(self.statement("pgss_status")).fetchone()
        if not row:
            return False, "", "off"
        return bool(row[0]), str(row[1]), str(row[2])

    def pgss_totals(self, statement: str) -> tuple[float, float, float, float] | None:
        """Cumulative (calls, plans, planning ms, execution ms) of the named statement in this
        database, as pg_stat_statements counts them."""
        row = self._session().execute(
            self.statement("pgss_claim_stats"),
            {"prefix": statement_prefix(statement, self.schema)}).fetchone()
        return (float(row[0]), float(row[1]), float(row[2]), float(row[3])) if row else None

    def pgss_unreadable(self, statements: list[str]) -> str | None:
        """Why pg_stat_statements cannot be read for these statements (the database's error),
        or None when it can."""
        try:
            for statement in statements:
                self.pgss_totals(statement)
        except psycopg.Error as exc:
            return str(exc)
        return None

    # -- the claim probe: a sampled EXPLAIN ---------------------------------------------------
    def probe_queue(self) -> str:
        """The queue with the most runnable tenants ('default' when there is none)."""
        row = self._session().execute(self.statement("probe_queue")).fetchone()
        return str(row[0]) if row else "default"

    def explain_claim(self, statement: str, params: dict[str, Any], *, statement_timeout_ms: int,
                      lock_timeout_ms: int
                      ) -> tuple[dict[str, Any] | None, tuple[int, int] | None]:
        """Run the named statement, prepared once per session as a worker's would be, under
        ``EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE`` in a transaction that is always rolled back.

        Returns the plan (None if PostgreSQL gave none) and (generic plans, custom plans) of the
        prepared statement so far. The rows the claim would take are locked until the rollback.
        """
        conn = self._session()
        name = f"fairq_probe_{statement}"
        text, order = to_prepare(statement, self.schema)
        if name not in self._prepared:
            types = pgsql.SQL(", ").join(pgsql.SQL(PARAM_TYPES.get(p, "unknown")) for p in order)
            conn.execute(pgsql.SQL("PREPARE {} ({}) AS ").format(pgsql.Identifier(name), types)
                         + pgsql.SQL(text))
            self._prepared.add(name)
        explain = pgsql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {}({})").format(
            pgsql.Identifier(name), pgsql.SQL(", ").join(pgsql.Literal(params[p]) for p in order))
        with conn.transaction(force_rollback=True):
            # A worker's planner settings (its plan cache mode included), so the plan, its
            # timings and the re-planning counts are those a worker's session gets.
            conn.execute(self.statement("transaction_settings"), {
                "statement_timeout": str(statement_timeout_ms), "lock_timeout": str(lock_timeout_ms),
                "synchronous_commit": None, "plan_cache_mode": PLAN_CACHE_MODE, **PLANNER_SETTINGS})
            row = conn.execute(explain).fetchone()
        if not row:
            return None, None
        plan = row[0][0] if isinstance(row[0], list) else row[0]
        counts = conn.execute(self.statement("prepared_plan_counts"), {"name": name}).fetchone()
        return plan, (int(counts[0]), int(counts[1])) if counts else None
