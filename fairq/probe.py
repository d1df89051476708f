"""Where claim time goes on the server: planning vs execution of the claim statements.

Two sources, chosen when the probe first connects (and again after a reconnect):

* ``pg_stat_statements`` when it is preloaded, created in the database and records planning
  (``pg_stat_statements.track_planning = on``): cumulative calls, plans, total_plan_time and
  total_exec_time of each claim statement, matched by its text. The histograms' ``_sum`` and
  ``_count`` follow those totals exactly; the bucket of each scrape interval's calls is the
  interval's mean (pg_stat_statements keeps no distribution). Re-planning ratio = plans / calls.
* Otherwise a sampled probe: at most once per ``interval`` seconds (never per claim) the claim
  statement is prepared once per session (as psycopg does for workers after a few executions)
  and run as ``EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE`` inside a transaction that is always
  rolled back, with short statement and lock timeouts. Planning and execution times come from
  the plan; the re-planning ratio is custom plans / all plans of that prepared statement, from
  ``pg_prepared_statements``, i.e. how often PostgreSQL's plan cache re-planned it.

The live source is named in every HELP text and in ``fairq_claim_probe_info{source=...}``.
The probe rolls back, but while it runs it does lock the rows the claim would take (SKIP LOCKED
claimers step around them), which is why it is rate-limited and time-limited.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from psycopg import sql as pgsql

from fairq import sql
from fairq.metrics import Hist
from fairq.policies import Policy, get_policy

log = logging.getLogger("fairq.probe")

PGSS = "pg_stat_statements"
SAMPLED = "explain_sample"
PLAN_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                0.25, 0.5, 1.0)
EXEC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                1.0, 2.5, 5.0)
# PostgreSQL types of the claim statements' parameters, for PREPARE.
PARAM_TYPES = {"queue": "text", "worker": "text", "batch": "int4", "window": "float8", "wait": "bool",
               "by_weight": "bool", "by_cost": "bool"}
_PARAM = re.compile(r"%\((\w+)\)s")


def statement_prefix(name: str, schema: str) -> str:
    """The text of a named statement up to its first parameter: what pg_stat_statements keeps."""
    text = sql.statement(name, schema)
    m = _PARAM.search(text)
    return text[: m.start()] if m else text


def to_prepare(name: str, schema: str) -> tuple[str, list[str]]:
    """The statement with ``$n`` placeholders, and the parameter names in ``$n`` order."""
    order: list[str] = []

    def repl(m: re.Match[str]) -> str:
        if m.group(1) not in order:
            order.append(m.group(1))
        return f"${order.index(m.group(1)) + 1}"

    text = _PARAM.sub(repl, sql.statement(name, schema)).replace("%%", "%")
    return text, order


@dataclass
class _Totals:
    calls: float = 0.0
    plans: float = 0.0
    plan_ms: float = 0.0
    exec_ms: float = 0.0


class ClaimProbe:
    """A prometheus-client collector for the claim statements' planning and execution time.

    Database work happens at scrape time only, under ``statement_timeout_ms``: pg_stat_statements
    is read at most every ``pgss_every`` seconds, the sampled probe runs at most every
    ``interval`` seconds per policy. ``source`` forces a source ("auto" picks as above).
    """

    def __init__(self, dsn: str, schema: str, policies: Sequence[str | Policy] = ("weighted",),
                 *, interval: float = 30.0, batch: int = 10, source: str = "auto",
                 statement_timeout_ms: int = 2000, lock_timeout_ms: int = 200,
                 pgss_every: float = 1.0) -> None:
        if source not in ("auto", PGSS, SAMPLED):
            raise ValueError(f"source must be auto, {PGSS} or {SAMPLED}, not {source!r}")
        self.dsn, self.schema = dsn, schema
        self.policies = [get_policy(p) for p in policies]
        self.interval, self.batch, self.forced = interval, batch, source
        self.statement_timeout_ms, self.lock_timeout_ms = statement_timeout_ms, lock_timeout_ms
        self.pgss_every = pgss_every
        self.source: str | None = None
        self.why = ""
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()
        self._planning = {p.name: Hist(PLAN_BUCKETS) for p in self.policies}
        self._execution = {p.name: Hist(EXEC_BUCKETS) for p in self.policies}
        self._ratio: dict[str, float] = {}
        self._errors = 0
        self._totals: dict[str, _Totals] = {}
        self._last_pgss = -1e18
        self._last_sample: dict[str, float] = {}
        self._prepared: set[str] = set()

    # -- which policy label a statement's pg_stat_statements numbers go under ------------------
    def _owners(self) -> dict[str, str]:
        """statement -> policy label: the first configured policy that runs it.

        The fair policies share ``claim_fair`` (they differ in bound parameters only), so
        pg_stat_statements cannot tell them apart; configure the one your workers use.
        """
        owners: dict[str, str] = {}
        for p in self.policies:
            if p.statement in sql.names():
                owners.setdefault(p.statement, p.name)
        return owners

    # -- connection and source ----------------------------------------------------------------
    def _connect(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=5,
                                         application_name="fairq-probe")
            self._prepared.clear()
            self.source, self.why = self._detect(self._conn)
        return self._conn

    def _detect(self, conn: psycopg.Connection[Any]) -> tuple[str, str]:
        if self.forced != "auto":
            return self.forced, "forced by configuration"
        row = conn.execute(sql.statement("pgss_status", self.schema)).fetchone()
        installed, preload, track = row if row else (False, "", "off")
        if PGSS not in str(preload):
            return SAMPLED, f"{PGSS} is not in shared_preload_libraries"
        if not installed:
            return SAMPLED, f"{PGSS} is preloaded but not created in this database"
        if str(track) != "on":
            return SAMPLED, f"{PGSS}.track_planning is off"
        try:
            self._read_pgss(conn, record=False)
        except psycopg.Error as exc:
            return SAMPLED, f"{PGSS} is not readable: {exc}"
        return PGSS, f"{PGSS} with track_planning"

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- refresh --------------------------------------------------------------------------------
    def refresh(self, force: bool = False) -> None:
        """Read pg_stat_statements or take due samples; errors are counted, never raised."""
        with self._lock:
            try:
                conn = self._connect()
                if self.source == PGSS:
                    if force or time.monotonic() - self._last_pgss >= self.pgss_every:
                        self._read_pgss(conn, record=True)
                        self._last_pgss = time.monotonic()
                else:
                    for policy in self.policies:
                        last = self._last_sample.get(policy.name, -1e18)
                        if force or time.monotonic() - last >= self.interval:
                            self._last_sample[policy.name] = time.monotonic()
                            self._sample(conn, policy)
            except Exception as exc:
                self._errors += 1
                log.warning("claim probe failed: %s", exc)
                # A broken connection, or a failure outside the database: start afresh next time.
                conn_gone = self._conn is not None and (self._conn.closed or self._conn.broken)
                if conn_gone or not isinstance(exc, psycopg.Error):
                    self.close()

    def _read_pgss(self, conn: psycopg.Connection[Any], *, record: bool) -> None:
        for statement, policy in self._owners().items():
            row = conn.execute(sql.statement("pgss_claim_stats", self.schema),
                               {"prefix": statement_prefix(statement, self.schema)}).fetchone()
            now = _Totals(*row) if row else _Totals()
            if not record:
                continue
            prev = self._totals.get(statement, _Totals())
            if now.calls < prev.calls or now.plans < prev.plans:  # pg_stat_statements_reset()
                prev = _Totals()
            dcalls, dplans = now.calls - prev.calls, now.plans - prev.plans
            if dcalls > 0:
                mean = (now.exec_ms - prev.exec_ms) / dcalls / 1000.0
                self._execution[policy].observe(mean, int(dcalls))
            if dplans > 0:
                mean = (now.plan_ms - prev.plan_ms) / dplans / 1000.0
                self._planning[policy].observe(mean, int(dplans))
            if dcalls > 0:
                self._ratio[policy] = dplans / dcalls
            elif now.calls > 0:
                self._ratio[policy] = now.plans / now.calls
            self._totals[statement] = now

    def _sample(self, conn: psycopg.Connection[Any], policy: Policy) -> None:
        name = f"fairq_probe_{policy.statement}"
        text, order = to_prepare(policy.statement, self.schema)
        if name not in self._prepared:
            types = pgsql.SQL(", ").join(pgsql.SQL(PARAM_TYPES.get(p, "unknown")) for p in order)
            conn.execute(pgsql.SQL("PREPARE {} ({}) AS ").format(pgsql.Identifier(name), types)
                         + pgsql.SQL(text))
            self._prepared.add(name)
        queue_row = conn.execute(sql.statement("probe_queue", self.schema)).fetchone()
        params = policy.claim_params(queue=queue_row[0] if queue_row else "default",
                                     batch=self.batch, worker="fairq-probe")
        explain = pgsql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {}({})").format(
            pgsql.Identifier(name), pgsql.SQL(", ").join(pgsql.Literal(params[p]) for p in order))
        with conn.transaction(force_rollback=True):
            conn.execute(sql.statement("metrics_timeouts", self.schema),
                         {"statement_ms": str(self.statement_timeout_ms),
                          "lock_ms": str(self.lock_timeout_ms)})
            row = conn.execute(explain).fetchone()
        if not row:
            return
        plan = row[0][0] if isinstance(row[0], list) else row[0]
        self._planning[policy.name].observe(float(plan["Planning Time"]) / 1000.0)
        self._execution[policy.name].observe(float(plan["Execution Time"]) / 1000.0)
        counts = conn.execute(sql.statement("prepared_plan_counts", self.schema),
                              {"name": name}).fetchone()
        if counts and (counts[0] + counts[1]) > 0:
            self._ratio[policy.name] = counts[1] / (counts[0] + counts[1])

    # -- exposition -----------------------------------------------------------------------------
    def describe_source(self) -> str:
        if self.source == PGSS:
            return (f"source: {PGSS} (per-scrape interval means: sum and count exact, "
                    "buckets approximate)")
        if self.source == SAMPLED:
            return (f"source: EXPLAIN ANALYZE sampled every {self.interval:g}s in a rolled-back "
                    f"transaction ({self.why})")
        return "source: not yet known (database unreachable)"

    def collect(self) -> Iterator[Metric]:
        self.refresh()
        with self._lock:
            src = self.describe_source()
            plan = HistogramMetricFamily(
                "fairq_claim_planning_seconds",
                f"Server-side planning time of the claim statement; {src}.", labels=["policy"])
            exe = HistogramMetricFamily(
                "fairq_claim_execution_seconds",
                f"Server-side execution time of the claim statement; {src}.", labels=["policy"])
            for p in self.policies:
                h = self._planning[p.name]
                if self.source != PGSS or p.name in self._owners().values():
                    plan.add_metric([p.name], h.buckets(), h.sum)
                    h = self._execution[p.name]
                    exe.add_metric([p.name], h.buckets(), h.sum)
            ratio_help = ("plans / calls over the last interval" if self.source == PGSS
                          else "custom plans / all plans of the probe's prepared claim")
            ratio = GaugeMetricFamily(
                "fairq_claim_replan_ratio",
                f"How often the claim statement is planned afresh ({ratio_help}); {src}.",
                labels=["policy"])
            for name, value in self._ratio.items():
                ratio.add_metric([name], value)
            info = GaugeMetricFamily("fairq_claim_probe_info",
                                     "Which source feeds the claim planning/execution metrics.",
                                     labels=["source"])
            info.add_metric([self.source or "unknown"], 1.0)
            errors = CounterMetricFamily("fairq_claim_probe_errors",
                                         "Probe or pg_stat_statements reads that failed.",
                                         value=self._errors)
        yield from (plan, exe, ratio, info, errors)
