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
  rolled back, with short statement and lock timeouts and a worker's planner settings (its plan
  cache mode included). Planning and execution times come from the plan; the re-planning ratio
  is custom plans / all plans of that prepared statement, from ``pg_prepared_statements``, i.e.
  how often the plan cache planned it afresh: 0 for a worker's generic plan.

The live source is named in every HELP text and in ``fairq_claim_probe_info{source=...}``.
The probe rolls back, but while it runs it does lock the rows the claim would take (SKIP LOCKED
claimers step around them), which is why it is rate-limited and time-limited.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from fairq import sql
from fairq.metrics import Hist
from fairq.policies import Policy, get_policy
from fairq.store.monitor import PARAM_TYPES, MonitorSession, statement_prefix, to_prepare

log = logging.getLogger("fairq.probe")

PGSS = "pg_stat_statements"
SAMPLED = "explain_sample"
PLAN_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                0.25, 0.5, 1.0)
EXEC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                1.0, 2.5, 5.0)


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
        self._db = MonitorSession(dsn, schema, application_name="fairq-probe")
        self._lock = threading.Lock()
        self._planning = {p.name: Hist(PLAN_BUCKETS) for p in self.policies}
        self._execution = {p.name: Hist(EXEC_BUCKETS) for p in self.policies}
        self._ratio: dict[str, float] = {}
        self._errors = 0
        self._totals: dict[str, _Totals] = {}
        self._last_pgss = -1e18
        self._last_sample: dict[str, float] = {}

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
    def _connect(self) -> None:
        """Connect if needed; a new session chooses its source again."""
        if self._db.connect():
            self.source, self.why = self._detect()

    def _detect(self) -> tuple[str, str]:
        if self.forced != "auto":
            return self.forced, "forced by configuration"
        installed, preload, track = self._db.pgss_status()
        if PGSS not in preload:
            return SAMPLED, f"{PGSS} is not in shared_preload_libraries"
        if not installed:
            return SAMPLED, f"{PGSS} is preloaded but not created in this database"
        if track != "on":
            return SAMPLED, f"{PGSS}.track_planning is off"
        error = self._db.pgss_unreadable(list(self._owners()))
        if error is not None:
            return SAMPLED, f"{PGSS} is not readable: {error}"
        return PGSS, f"{PGSS} with track_planning"

    def close(self) -> None:
        self._db.close()

    # -- refresh --------------------------------------------------------------------------------
    def refresh(self, force: bool = False) -> None:
        """Read pg_stat_statements or take due samples; errors are counted, never raised."""
        with self._lock:
            try:
                self._connect()
                if self.source == PGSS:
                    if force or time.monotonic() - self._last_pgss >= self.pgss_every:
                        self._read_pgss()
                        self._last_pgss = time.monotonic()
                else:
                    for policy in self.policies:
                        last = self._last_sample.get(policy.name, -1e18)
                        if force or time.monotonic() - last >= self.interval:
                            self._last_sample[policy.name] = time.monotonic()
                            self._sample(policy)
            except Exception as exc:
                self._errors += 1
                log.warning("claim probe failed: %s", exc)
                # A broken connection, or a failure outside the database: start afresh next time.
                self._db.recover(exc)

    def _read_pgss(self) -> None:
        for statement, policy in self._owners().items():
            row = self._db.pgss_totals(statement)
            now = _Totals(*row) if row else _Totals()
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

    def _sample(self, policy: Policy) -> None:
        params = policy.claim_params(queue=self._db.probe_queue(), batch=self.batch,
                                     worker="fairq-probe")
        plan, counts = self._db.explain_claim(policy.statement, params,
                                              statement_timeout_ms=self.statement_timeout_ms,
                                              lock_timeout_ms=self.lock_timeout_ms)
        if plan is None:
            return
        self._planning[policy.name].observe(float(plan["Planning Time"]) / 1000.0)
        self._execution[policy.name].observe(float(plan["Execution Time"]) / 1000.0)
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


__all__ = ["EXEC_BUCKETS", "PARAM_TYPES", "PGSS", "PLAN_BUCKETS", "SAMPLED", "ClaimProbe",
           "statement_prefix", "to_prepare"]
