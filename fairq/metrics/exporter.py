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
from heapq import nsmallest
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from fairq.metrics import OTHER, MetricsServer, db_check, max_tenants_from_env, serve
from fairq.policies.fairness import jain_index, max_share_error
from fairq.runtime.signals import SignalRelay
from fairq.store.monitor import MonitorSession, failed_statement

log = logging.getLogger("fairq.exporter")


class TenantRow(NamedTuple):
    """One (queue, tenant) as ``exporter_tenants`` reads it (a tuple: the exporter builds one
    per tenant per refresh, 100,000 of them with as many tenants)."""

    queue: str
    tenant: str
    weight: float
    max_running: int
    running: int
    claimed_total: int
    queued: int
    runnable: int
    oldest_age: float
    rate: float | None = None      # jobs per second; None: no rate limit
    tokens: float | None = None    # its token bucket now
    throttled: bool = False        # asleep until its next token
    throttled_seconds: float = 0.0  # time spent with a due job and no token, so far
    tenant_group: str = "default"
    group_weight: float = 1.0
    # Backlogged: its weight times its group's factor over the queue's backlogged tenants of
    # the group, read from the database (effective_weight); None when not backlogged.
    effective_weight: float | None = None


def keep_tenants(rows: Sequence[TenantRow], limit: int) -> set[str]:
    """The tenants that keep their own series: half the slots by oldest wait, then by backlog.
    (The first few of each order are picked without sorting every tenant.)"""
    age: dict[str, float] = {}
    backlog: dict[str, tuple[int, int]] = {}
    for r in rows:
        t = r.tenant
        if t in backlog:
            age[t] = max(age[t], r.oldest_age)
            q, run = backlog[t]
            backlog[t] = (q + r.queued, run + r.running)
        else:
            age[t] = max(0.0, r.oldest_age)
            backlog[t] = (r.queued, r.running)
    if len(backlog) <= limit:
        return set(backlog)
    # Plain tuples, compared natively: a key function per tenant costs more than the heap.
    by_age = nsmallest(math.ceil(limit / 2), ((-a, t) for t, a in age.items() if a > 0))
    kept = {t for _, t in by_age}
    # At most len(kept) of the first `limit + len(kept)` by backlog are kept already.
    for *_, t in nsmallest(limit + len(kept),
                           ((-q, -run, -age[t], t) for t, (q, run) in backlog.items())):
        if len(kept) >= limit:
            break
        kept.add(t)
    return kept


def keep_queues(rows: Sequence[TenantRow], leases: dict[str, int], limit: int) -> set[str]:
    """The queues that keep their own series (the same limit as tenants): by backlog, then
    oldest wait; the others are summed into ``queue="__other__"``."""
    size: dict[str, tuple[int, float]] = {q: (n, 0.0) for q, n in leases.items()}
    for r in rows:
        n, age = size.get(r.queue, (0, 0.0))
        size[r.queue] = (n + r.queued + r.running, max(age, r.oldest_age))
    if len(size) <= limit:
        return set(size)
    return set(sorted(size, key=lambda q: (-size[q][0], -size[q][1], q))[:limit])


def by_queue(rows: Sequence[TenantRow]) -> dict[str, list[TenantRow]]:
    """The rows of each queue, queues in order: one pass, however many queues."""
    out: dict[str, list[TenantRow]] = {}
    for r in rows:
        out.setdefault(r.queue, []).append(r)
    return dict(sorted(out.items()))


def fairness(rows: Sequence[TenantRow], claims: dict[tuple[str, str], float],
             grouped: dict[str, list[TenantRow]] | None = None
             ) -> dict[str, tuple[float, float]]:
    """queue -> (Jain's index, max share error) over the queue's backlogged tenants (those
    with an effective weight). ``grouped``: ``by_queue(rows)``, when the caller has it."""
    out: dict[str, tuple[float, float]] = {}
    for queue, its in (by_queue(rows) if grouped is None else grouped).items():
        weights = {r.tenant: w for r in its if (w := r.effective_weight) is not None}
        service = {t: claims.get((queue, t), 0.0) for t in weights}
        values = [service[t] / weights[t] for t in service]
        out[queue] = (jain_index(values), max_share_error(service, weights))
    return out


def group_shares(rows: Sequence[TenantRow], claims: dict[tuple[str, str], float],
                 grouped: dict[str, list[TenantRow]] | None = None
                 ) -> dict[tuple[str, str], tuple[float, float]]:
    """(queue, group) -> (share of the window's claims, share of weight) over the groups with
    backlogged tenants. ``grouped``: ``by_queue(rows)``, when the caller has it."""
    out: dict[tuple[str, str], tuple[float, float]] = {}
    for queue, its in (by_queue(rows) if grouped is None else grouped).items():
        backlogged = [r for r in its if r.runnable > 0 and r.max_running > 0]
        gw = {r.tenant_group: r.group_weight for r in backlogged}
        served: dict[str, float] = {}
        for r in backlogged:
            served[r.tenant_group] = served.get(r.tenant_group, 0.0) + claims.get((queue, r.tenant), 0.0)
        total_w, total_s = sum(gw.values()), sum(served.values())
        for g in sorted(gw):
            out[(queue, g)] = (served[g] / total_s if total_s else 0.0, gw[g] / total_w)
    return out


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

    def close(self) -> None:
        running = self._refreshing
        if running is not None:
            running.join()
        self._db.close()

    def _query(self) -> tuple[list[TenantRow], dict[str, int], dict[str, Any] | None]:
        tenants, leases, table = self._db.exporter_snapshot(self.statement_timeout_ms)
        rows = [TenantRow(**r) for r in tenants]
        return rows, leases, table

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
            rows, leases, table = self._query()
        except Exception as exc:
            self._errors += 1
            self._up = 0.0
            statement = failed_statement(exc)
            log.warning("exporter query %sfailed: %s",
                        f"{statement} " if statement else "", " ".join(str(exc).split()))
            self._db.recover(exc)
            return []
        self._up = 1.0
        claims = self._window_claims(rows, started)
        families = self._families(rows, leases, table, claims)
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
            due = time.monotonic() - self._refreshed_at >= self.interval or not self._up
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
