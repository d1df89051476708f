"""``fairq exporter``: database-level gauges for Prometheus from one scrape-time collector.

Workers only count what they do; what the database knows (backlog, caps, weights, oldest
runnable age, fairness over a recent window, unreaped expired leases, vacuum health) is read
here, by one process, at scrape time, under a statement timeout, and at most once per
``interval`` seconds however many Prometheus servers scrape it.

Fairness: the claims each tenant received in the last ``window`` seconds are the deltas of
``tenant_schedule.claimed_total`` between this process's own snapshots, so nothing scans the
jobs table for it. Over the backlogged tenants of a queue (runnable jobs now, not paused), the
claims per unit weight give Jain's index and the max share error; right after start the window
is shorter (it grows with the snapshots kept).

The ``tenant`` label is folded like the workers' (``fairq.metrics``): the top
``FAIRQ_METRICS_MAX_TENANTS`` tenants keep their series, half of the slots by oldest runnable
age (a small starving tenant stays visible) and the rest by backlog; the others are summed into
``tenant="__other__"`` (oldest age: the max). Gauges are rebuilt on every refresh, so a tenant
that leaves the top set simply stops being exported. ``__other__`` has no weight or cap series.
The ``queue`` label is bounded by the same limit: the largest queues keep their series, the rest
are summed into ``queue="__other__"`` (no fairness series for it).

It binds 127.0.0.1 unless told otherwise (``--host``): its series name customers (tenants).
"""

from __future__ import annotations

import gc
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from fairq.metrics import OTHER, MetricsServer, db_check, max_tenants_from_env, serve
from fairq.metrics.exporter_rows import (
    TenantRow,
    by_queue,
    fairness,
    group_shares,
    keep_queues,
    keep_tenants,
    waiting_family,
)
from fairq.runtime.db_errors import react
from fairq.runtime.outage import OUTAGE_KINDS, Outage
from fairq.runtime.signals import SignalRelay
from fairq.store.monitor import MonitorSession, failed_statement

log = logging.getLogger("fairq.exporter")


class DatabaseCollector:
    """The exporter's scrape-time collector (prometheus-client custom collector protocol)."""

    def __init__(self, dsn: str, schema: str, *, max_tenants: int | None = None,
                 interval: float = 5.0, window: float = 300.0,
                 statement_timeout_ms: int = 5000, scrape_wait: float = 1.5) -> None:
        self.dsn, self.schema, self.scrape_wait = dsn, schema, scrape_wait
        self.max_tenants = max_tenants_from_env() if max_tenants is None else max_tenants
        self.interval, self.window = interval, window
        self.statement_timeout_ms = statement_timeout_ms
        self._db = MonitorSession(dsn, schema, application_name="fairq-exporter")
        self._lock = threading.Lock()
        self._refreshing: threading.Thread | None = None
        self._snapshots: deque[tuple[float, dict[tuple[str, str], int]]] = deque()
        self._cached: list[Metric] = []
        self._refreshed_at = -math.inf
        self._errors = 0
        self._up = 0.0
        self._duration = 0.0
        # Lost connections: one line when lost, one when back, counted; while the database is
        # away a scrape reads again only after a backoff (jittered, at most 2 s).
        self._outage = Outage(log, settle=0.0)  # reads are seconds apart: no storm to merge
        self._failures = 0
        self._retry_at = -math.inf

    def close(self) -> None:
        running = self._refreshing
        if running is not None:
            running.join()
        self._db.close()

    def _query(self) -> tuple[list[TenantRow], dict[str, int], dict[str, Any] | None,
                              dict[tuple[str, str], int]]:
        tenants, leases, table, waiting = self._db.exporter_snapshot(self.statement_timeout_ms)
        rows = [TenantRow(**r) for r in tenants]
        return rows, leases, table, waiting

    def _window_claims(self, rows: Sequence[TenantRow], now: float) -> dict[tuple[str, str], float]:
        """Claims per (queue, tenant) since the oldest snapshot still inside the window. A
        snapshot is kept every tenth of the window at most (the baseline may start that much
        earlier): at 100,000 tenants one takes about 20 MB, and one per refresh took gigabytes."""
        if not self._snapshots or now - self._snapshots[-1][0] >= self.window / 10:
            self._snapshots.append((now, {(r.queue, r.tenant): r.claimed_total for r in rows}))
        # Keep one snapshot at or just beyond the window's start as the baseline.
        while len(self._snapshots) > 1 and self._snapshots[1][0] <= now - self.window:
            self._snapshots.popleft()
        base = self._snapshots[0][1]
        # A row created in the window counts from 0; a row recreated (lower total) from its own.
        # Only the backlogged tenants' claims are judged (fairness, group shares).
        out: dict[tuple[str, str], float] = {}
        for r in rows:
            if (r.runnable > 0 and r.max_running > 0) or r.effective_weight is not None:
                k = (r.queue, r.tenant)
                v, b = r.claimed_total, base.get(k, 0)
                out[k] = float(v - b) if v >= b else float(v)
        return out

    def refresh(self) -> list[Metric]:
        started = time.monotonic()
        # A refresh builds a few objects per tenant that all live until it ends: the cyclic
        # collector's passes over them found nothing and cost a quarter of a refresh at 100,000
        # tenants. Paused for the refresh (nothing in it makes cycles), then back as it was.
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._refresh(started)
        finally:
            if collecting:
                gc.enable()

    def _refresh(self, started: float) -> list[Metric]:
        try:
            rows, leases, table, waiting = self._query()
        except Exception as exc:
            self._errors += 1
            self._failures += 1
            self._up = 0.0
            r = react(exc, self._failures, 30.0, "reading again")
            self._retry_at = time.monotonic() + r.delay
            if r.kind in OUTAGE_KINDS:
                self._outage.lost(exc, r.delay)
            else:
                statement = failed_statement(exc)
                log.warning("exporter query %sfailed: %s",
                            f"{statement} " if statement else "", " ".join(str(exc).split()))
            self._db.recover(exc)
            return []
        self._up = 1.0
        self._failures = 0
        self._outage.ok()
        claims = self._window_claims(rows, started)
        families = self._families(rows, leases, table, claims)
        families.append(waiting_family(waiting, keep_queues(rows, leases, self.max_tenants)))
        self._duration = time.monotonic() - started
        return families

    def _families(self, rows: Sequence[TenantRow], leases: dict[str, int],
                  table: dict[str, Any] | None, claims: dict[tuple[str, str], float]
                  ) -> list[Metric]:
        kept = keep_tenants(rows, self.max_tenants)
        kept_queues = keep_queues(rows, leases, self.max_tenants)
        # (queue, tenant) label -> [queued, running, delayed, oldest age, throttled seconds]:
        # one lookup per row, as a refresh reads every tenant.
        sums: dict[tuple[str, str], list[float]] = {}
        caps: dict[str, float] = {}
        weights: dict[str, float] = {}
        for r in rows:
            label = r.tenant if r.tenant in kept else OTHER
            key = (r.queue if r.queue in kept_queues else OTHER, label)
            acc = sums.get(key)
            if acc is None:
                sums[key] = [float(r.queued), float(r.running), float(r.queued - r.runnable),
                             max(0.0, r.oldest_age), r.throttled_seconds]
            else:
                acc[0] += r.queued
                acc[1] += r.running
                acc[2] += r.queued - r.runnable
                acc[3] = max(acc[3], r.oldest_age)
                acc[4] += r.throttled_seconds
            if label != OTHER:
                caps[r.tenant] = max(caps.get(r.tenant, 0.0), float(r.max_running))
                weights[r.tenant] = max(weights.get(r.tenant, 0.0), r.weight)
        g_queued = GaugeMetricFamily("fairq_tenant_queued_jobs",
                                     "Jobs in status queued (due or delayed).",
                                     labels=["queue", "tenant"])
        g_running = GaugeMetricFamily("fairq_tenant_running_jobs",
                                      "Jobs running now (the scheduler's exact count).",
                                      labels=["queue", "tenant"])
        g_oldest = GaugeMetricFamily("fairq_oldest_runnable_job_age_seconds",
                                     "Age of the oldest due, unclaimed job since its run_at "
                                     "(0 when none).", labels=["queue", "tenant"])
        g_delayed = GaugeMetricFamily("fairq_tenant_delayed_jobs",
                                      "Queued jobs not due yet (run_at in the future: delayed "
                                      "or waiting to retry); due = queued - delayed.",
                                      labels=["queue", "tenant"])
        c_throttled = CounterMetricFamily(
            "fairq_tenant_throttled_seconds",
            "Seconds the tenant had a due job but no token of its rate limit (docs/algorithm.md, "
            "\"Time spent throttled\"); 0 without a limit.", labels=["queue", "tenant"])
        for key in sorted(sums):
            queued, running, delayed, oldest, throttled = sums[key]
            g_queued.add_metric(list(key), queued)
            c_throttled.add_metric(list(key), throttled)
            g_delayed.add_metric(list(key), delayed)
            g_running.add_metric(list(key), running)
            g_oldest.add_metric(list(key), oldest)
        g_cap = GaugeMetricFamily("fairq_tenant_max_running",
                                  "Tenant's cap on running jobs (0 = paused).", labels=["tenant"])
        g_weight = GaugeMetricFamily("fairq_tenant_weight", "Tenant's fair-share weight.",
                                     labels=["tenant"])
        for t in sorted(caps):
            g_cap.add_metric([t], caps[t])
            g_weight.add_metric([t], weights[t])
        g_jain = GaugeMetricFamily(
            "fairq_fairness_jain_index",
            f"Jain's index of claims per unit weight over backlogged tenants, last "
            f"{self.window:g}s (1 = fair).", labels=["queue"])
        g_err = GaugeMetricFamily(
            "fairq_fairness_max_share_error",
            f"Max over backlogged tenants of |share of claims - share of weight|, last "
            f"{self.window:g}s.", labels=["queue"])
        grouped = by_queue(rows)
        for queue, (jain, err) in fairness(rows, claims, grouped).items():
            if queue in kept_queues:  # a folded queue's fairness is not a sum: not exported
                g_jain.add_metric([queue], jain)
                g_err.add_metric([queue], err)
        g_leases = GaugeMetricFamily(
            "fairq_leases_expired_unreaped_jobs",
            "Running jobs whose lease expired and that no reaper has returned yet "
            "(reaped ones: fairq_leases_expired_total from the workers).", labels=["queue"])
        expired: dict[str, float] = {}
        for queue in {r.queue for r in rows} | set(leases):
            label = queue if queue in kept_queues else OTHER
            expired[label] = expired.get(label, 0.0) + leases.get(queue, 0)
        for queue in sorted(expired):
            g_leases.add_metric([queue], expired[queue])
        folded = {r.tenant for r in rows} - kept
        g_folded = GaugeMetricFamily(
            "fairq_metrics_tenants_folded",
            f"Tenants folded into tenant=\"__other__\" (top {self.max_tenants} kept).",
            value=float(len(folded)))
        out: list[Metric] = [g_queued, g_delayed, g_running, g_oldest, c_throttled, g_cap, g_weight,
                             g_jain, g_err, g_leases, g_folded, *self._rate_families(rows, kept, kept_queues),
                             *self._group_families(rows, claims, kept_queues, grouped)]
        if table is not None:
            last = max(table["last_autovacuum"] or 0.0, table["last_vacuum"] or 0.0)
            out += [
                GaugeMetricFamily("fairq_jobs_dead_tuples",
                                  "Dead tuples in the jobs table (pg_stat_user_tables).",
                                  value=table["dead"]),
                GaugeMetricFamily("fairq_jobs_live_tuples",
                                  "Live tuples in the jobs table (pg_stat_user_tables).",
                                  value=table["live"]),
                GaugeMetricFamily("fairq_jobs_last_autovacuum_timestamp_seconds",
                                  "Last (auto)vacuum of the jobs table, Unix time; 0 = never.",
                                  value=last),
                CounterMetricFamily("fairq_jobs_autovacuum_runs",
                                    "Autovacuum runs on the jobs table since stats reset.",
                                    value=table["autovacuum_count"]),
                CounterMetricFamily("fairq_jobs_inserted",
                                    "Rows inserted into the jobs table since stats reset "
                                    "(pg_stat_user_tables.n_tup_ins): every enqueue, from any "
                                    "process or transaction, rolled back ones included.",
                                    value=table["inserted"] or 0.0),
            ]
        return out

    @staticmethod
    def _rate_families(rows: Sequence[TenantRow], kept: set[str], queues: set[str]
                       ) -> list[Metric]:
        """Rate-limited tenants (kept ones only): the limit, the bucket, and whether the tenant
        is asleep until its next token (docs/algorithm.md, "Rate limits")."""
        g_rate = GaugeMetricFamily("fairq_tenant_rate_limit",
                                   "Tenant's rate limit, jobs started per second per queue.",
                                   labels=["queue", "tenant"])
        g_tokens = GaugeMetricFamily("fairq_tenant_rate_tokens",
                                     "Tokens in the tenant's bucket (jobs it may start now).",
                                     labels=["queue", "tenant"])
        g_throttled = GaugeMetricFamily("fairq_tenant_throttled",
                                        "1 while the tenant waits for its next token.",
                                        labels=["queue", "tenant"])
        for r in rows:
            if r.rate is None or r.tenant not in kept or r.queue not in queues:
                continue
            g_rate.add_metric([r.queue, r.tenant], r.rate)
            g_tokens.add_metric([r.queue, r.tenant], r.tokens or 0.0)
            g_throttled.add_metric([r.queue, r.tenant], 1.0 if r.throttled else 0.0)
        return [g_rate, g_tokens, g_throttled]

    def _group_families(self, rows: Sequence[TenantRow], claims: dict[tuple[str, str], float],
                        queues: set[str], grouped: dict[str, list[TenantRow]]) -> list[Metric]:
        """Each tenant group's share of the window's claims against its share of weight, on the
        kept queues (a share is not a sum: a folded queue has none)."""
        g_claims = GaugeMetricFamily(
            "fairq_group_claim_share",
            f"Group's share of the claims of its queue's backlogged tenants, last {self.window:g}s.",
            labels=["queue", "group"])
        g_weight = GaugeMetricFamily(
            "fairq_group_weight_share",
            "Group's weight over the weights of the groups with backlogged tenants.",
            labels=["queue", "group"])
        for (queue, group), (served, weight) in group_shares(rows, claims, grouped).items():
            if queue not in queues:
                continue
            g_claims.add_metric([queue, group], served)
            g_weight.add_metric([queue, group], weight)
        return [g_claims, g_weight]

    def collect(self) -> Iterator[Metric]:
        """The cached families, refreshed first when older than ``interval``. The refresh runs
        on a thread of its own, and a scrape waits for it at most ``scrape_wait`` seconds: past
        that (a slow database, tens of thousands of tenants) the scrape serves the previous
        refresh's values and the next scrape gets the new ones, so that Prometheus' scrape
        timeout is never what ends it. The first scrape waits for the first refresh."""
        with self._lock:
            now = time.monotonic()
            due = (now - self._refreshed_at >= self.interval
                   or (not self._up and now >= self._retry_at))
            if due and self._refreshing is None:
                self._refreshing = threading.Thread(target=self._refresh_cache, daemon=True,
                                                    name="fairq-exporter-refresh")
                self._refreshing.start()
            running, first = self._refreshing, self._refreshed_at == -math.inf
        if running is not None:
            running.join(None if first else self.scrape_wait)
        with self._lock:
            cached = list(self._cached)
            up, errors, duration = self._up, self._errors, self._duration
        yield from cached
        yield GaugeMetricFamily("fairq_exporter_up",
                                "1 when the last database read succeeded.", value=up)
        yield CounterMetricFamily("fairq_exporter_errors",
                                  "Database reads that failed or timed out.", value=errors)
        yield GaugeMetricFamily("fairq_exporter_refresh_seconds",
                                "Duration of the last database read.", value=duration)
        yield CounterMetricFamily("fairq_db_reconnects",
                                  "Outages the exporter came back from: the database answered "
                                  "again after its connection was lost.",
                                  value=self._outage.reconnects)

    def _refresh_cache(self) -> None:
        families: list[Metric] = []
        try:
            families = self.refresh()
        finally:
            with self._lock:
                self._cached, self._refreshed_at, self._refreshing = families, time.monotonic(), None


def build_registry(dsn: str, schema: str, *, max_tenants: int | None = None,
                   interval: float = 5.0, window: float = 300.0,
                   statement_timeout_ms: int = 5000, policies: Sequence[str] = ("weighted",),
                   probe_interval: float = 30.0, probe_source: str = "auto",
                   probe: bool = True) -> CollectorRegistry:
    """A registry with the database collector and (unless ``probe=False``) the claim probe."""
    registry = CollectorRegistry()
    registry.register(DatabaseCollector(dsn, schema, max_tenants=max_tenants, interval=interval,
                                        window=window, statement_timeout_ms=statement_timeout_ms))
    if probe:
        from fairq.metrics.probe import ClaimProbe

        registry.register(ClaimProbe(dsn, schema, policies, interval=probe_interval,
                                     source=probe_source,
                                     statement_timeout_ms=min(statement_timeout_ms, 2000)))
    return registry


def run(dsn: str, schema: str, *, host: str = "127.0.0.1", port: int = 9765,
        stop: threading.Event | None = None, ready: Any = None, **options: Any) -> None:
    """Serve until SIGTERM/SIGINT (or ``stop`` is set); /healthz = the database answers."""
    registry = build_registry(dsn, schema, **options)
    server: MetricsServer = serve(port, host, health=db_check(dsn), registry=registry)
    stopping = stop or threading.Event()
    try:
        with SignalRelay(lambda _: stopping.set()):  # a second signal exits at once
            if ready is not None:
                ready(server)
            stopping.wait()
    finally:
        server.close()
