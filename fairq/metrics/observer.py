"""The worker metrics for Prometheus (``PrometheusObserver``), with bounded label values.

Why a custom collector instead of prometheus-client's Counter/Histogram with labels: the tenant
label must stay bounded (docs/metrics.md: top ``FAIRQ_METRICS_MAX_TENANTS`` tenants, the rest folded into
``tenant="__other__"``) and a tenant that drops out of the top set must lose its series. The
observer therefore keeps its own table of accumulators keyed by the *rendered* label values and
re-ranks tenants periodically:

* A tenant with its own series ("live") gets its increments on its own series.
* Any other tenant's increments go to the ``__other__`` series of the same family.
* On re-rank, demoted tenants' series are deleted (they go stale in Prometheus at the next
  scrape); their later increments land in ``__other__``. Promoted tenants start fresh series
  from zero.

So every series only ever grows while it exists: ``__other__`` never gives anything back (moving a
demoted tenant's history into it would make it jump; moving it out again would make it fall,
which Prometheus reads as a counter reset), and a re-promoted tenant's new series restarting at
zero is an ordinary counter reset that ``rate()`` handles. Re-ranking happens at most once per
``rerank_seconds`` and favours current members, so series do not flap.

The ``queue`` and ``task`` labels are folded the same way, with the same limit (a job's task or
queue is whatever name a producer wrote: 300 unknown task names must not make 300 series).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from fairq.metrics.fold import ENV_MAX_TENANTS, TenantFold, max_tenants_from_env
from fairq.metrics.fresh_series import FreshSeries
from fairq.metrics.hist import Hist
from fairq.metrics.server import MetricsServer, serve
from fairq.models import ClaimedJob
from fairq.observe import DB_ERROR_KINDS

WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                120.0, 300.0, 600.0, 1800.0, 3600.0)
RUN_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
               300.0, 900.0, 3600.0)
OUTCOMES = ("done", "retry", "failed", "lease_lost")
RESULTS = ("claimed", "empty", "error")
REAP_OUTCOMES = ("requeued", "failed")
CLAIM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class PrometheusObserver:
    """A ``fairq.observe.WorkerObserver`` exporting the worker metrics of docs/metrics.md.

    ``registry=None`` makes a fresh registry with the process/platform/GC collectors, so several
    observers (tests, benchmarks) never collide in prometheus-client's global registry.
    """

    def __init__(self, registry: CollectorRegistry | None = None,
                 max_tenants: int | None = None, *, rerank_seconds: float = 60.0,
                 stale_after: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        if registry is None:
            registry = CollectorRegistry()
            ProcessCollector(registry=registry)
            PlatformCollector(registry=registry)
            GCCollector(registry=registry)
        self.registry = registry
        self.fold = TenantFold(max_tenants_from_env() if max_tenants is None else max_tenants,
                               rerank_seconds, clock)
        # Queue and task names are data too (a job's task may be any name a producer wrote):
        # their label values are folded the same way, with the same limit.
        self.queue_fold = TenantFold(self.fold.limit, rerank_seconds, clock)
        self.task_fold = TenantFold(self.fold.limit, rerank_seconds, clock)
        self.stale_after = stale_after
        self._clock = clock
        self._lock = threading.Lock()
        self._enqueued: dict[tuple[str, str], float] = {}
        self._claimed: dict[tuple[str, str, str], float] = {}
        self._finished: dict[tuple[str, str, str], float] = {}
        self._wait: dict[tuple[str, str], Hist] = {}
        self._run: dict[tuple[str, str, str], Hist] = {}
        self._claim: dict[tuple[str, str, str], Hist] = {}
        self._leases: dict[str, float] = {}
        self._reaped: dict[tuple[str, str], float] = {}  # (queue, outcome)
        # Every kind at 0 from the start: a rate of deadlocks is 0, not absent.
        self._db_errors: dict[str, float] = dict.fromkeys(DB_ERROR_KINDS, 0.0)
        self._reconnects = 0.0
        self._last_loop: float | None = None
        self._created = clock()
        self._fresh = FreshSeries()  # a tenant's first series are shown at 0 first
        self._loop_ok = False
        self.server: MetricsServer | None = None
        registry.register(self)

    # -- hooks (called by the worker; keep them cheap) -------------------------------------
    def on_enqueue(self, queue: str, tenant: str, count: int) -> None:
        with self._lock:
            key = (self._queue(queue, count), self._label(tenant, count))
            self._enqueued[key] = self._enqueued.get(key, 0.0) + count

    def on_claim(self, queue: str, policy: str, result: str, seconds: float,
                 jobs: Sequence[ClaimedJob]) -> None:
        with self._lock:
            queue = self._queue(queue, 1.0 + len(jobs))
            self._leases.setdefault(queue, 0.0)  # the series exists from the first claim on
            for outcome in REAP_OUTCOMES:
                self._reaped.setdefault((queue, outcome), 0.0)
            h = self._claim.get((queue, policy, result))
            if h is None:
                # Every result's series exists from the first claim on: a rate of errors is 0,
                # not absent, and ratios over results work from the start.
                for r in RESULTS:
                    self._claim.setdefault((queue, policy, r), Hist(CLAIM_BUCKETS))
                h = self._claim[(queue, policy, result)]
            h.observe(seconds)
            for job in jobs:
                wait = job.wait_seconds
                tenant = self._label(job.tenant, 1.0 + wait)
                ck = (queue, tenant, policy)  # a claim's jobs are all of its queue
                self._claimed[ck] = self._claimed.get(ck, 0.0) + 1
                wk = (queue, tenant)
                w = self._wait.get(wk)
                if w is None:
                    w = self._wait[wk] = Hist(WAIT_BUCKETS)
                w.observe(wait)

    def on_finish(self, job: ClaimedJob, outcome: str, run_seconds: float) -> None:
        with self._lock:
            tenant = self._label(job.tenant, 1.0)
            queue = self._queue(job.queue, 1.0)
            fk = (queue, tenant, outcome)
            if fk not in self._finished:  # all outcomes at 0 from the first finish on
                for o in OUTCOMES:
                    self._finished.setdefault((queue, tenant, o), 0.0)
            self._finished[fk] = self._finished.get(fk, 0.0) + 1
            rk = (queue, tenant, self._task(job.task))
            r = self._run.get(rk)
            if r is None:
                r = self._run[rk] = Hist(RUN_BUCKETS)
            r.observe(max(run_seconds, 0.0))

    def on_reap(self, queue: str, expired: int, failed: int = 0) -> None:
        with self._lock:
            queue = self._queue(queue, expired)
            self._leases[queue] = self._leases.get(queue, 0.0) + expired
            for outcome, n in (("requeued", expired - failed), ("failed", failed)):
                key = (queue, outcome)
                self._reaped[key] = self._reaped.get(key, 0.0) + n

    def on_loop(self, healthy: bool) -> None:
        self._last_loop = self._clock()
        self._loop_ok = healthy

    def on_db_error(self, kind: str) -> None:
        with self._lock:
            self._db_errors[kind] = self._db_errors.get(kind, 0.0) + 1

    def on_reconnect(self) -> None:
        with self._lock:
            self._reconnects += 1

    # -- health ------------------------------------------------------------------------------
    def loop_alive(self) -> bool:
        """True while the worker loop turns (healthy or not): it ticked, or the observer was
        made, within ``stale_after`` seconds. A database outage does not make it False."""
        last = self._last_loop if self._last_loop is not None else self._created
        return self._clock() - last <= self.stale_after

    def loop_healthy(self) -> bool:
        """True when the worker loop ticked within ``stale_after`` seconds and reported healthy."""
        last = self._last_loop
        return last is not None and self._loop_ok and self._clock() - last <= self.stale_after

    # -- tenant fold -------------------------------------------------------------------------
    def _label(self, tenant: str, activity: float) -> str:
        if self.fold.due():
            self._rerank()
        return self.fold.label(tenant, activity)

    def _queue(self, queue: str, activity: float) -> str:
        """The ``queue`` label value: folded like tenants (caller holds the lock)."""
        if self.queue_fold.due():
            self._rerank()
        return self.queue_fold.label(queue, activity)

    def _task(self, task: str) -> str:
        """The ``task`` label value: folded like tenants (caller holds the lock)."""
        if self.task_fold.due():
            self._rerank()
        return self.task_fold.label(task, 1.0)

    def _rerank(self, force: bool = False) -> None:
        """Re-rank each fold that is due (all with ``force``) and drop its demoted series."""
        tables: tuple[dict[Any, Any], ...] = (
            self._enqueued, self._claimed, self._finished, self._wait, self._run)
        folds = ((self.fold, 1, tables), (self.queue_fold, 0, (*tables, self._claim)),
                 (self.task_fold, 2, (self._run,)))
        for fold, position, in_tables in folds:
            if not (force or fold.due()):
                continue
            demoted = fold.rerank()
            if not demoted:
                continue
            for table in in_tables:
                for key in [k for k in table if k[position] in demoted]:
                    del table[key]
            if fold is self.queue_fold:
                for queue in demoted:
                    self._leases.pop(queue, None)
                    for outcome in REAP_OUTCOMES:
                        self._reaped.pop((queue, outcome), None)

    def rerank_now(self) -> None:
        """Re-rank immediately (tests, or an operator-triggered refresh)."""
        with self._lock:
            self._rerank(force=True)

    # -- exposition --------------------------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        with self._lock:
            if self.fold.due() or self.queue_fold.due() or self.task_fold.due():
                self._rerank()
            enq = CounterMetricFamily(
                "fairq_jobs_enqueued", "Jobs enqueued by this process.", labels=["queue", "tenant"])
            for (q, t), v in self._enqueued.items():
                enq.add_metric([q, t], v)
            claimed = CounterMetricFamily(
                "fairq_jobs_claimed", "Jobs claimed by this worker.",
                labels=["queue", "tenant", "policy"])
            for (q, t, p), v in self._claimed.items():
                claimed.add_metric([q, t, p], v)
            finished = CounterMetricFamily(
                "fairq_jobs_finished", "Jobs this worker finished, by outcome "
                "(done, retry, failed, lease_lost).", labels=["queue", "tenant", "outcome"])
            for (q, t, o), v in self._finished.items():
                finished.add_metric([q, t, o], v)
            wait = HistogramMetricFamily(
                "fairq_job_wait_seconds",
                "From eligible (run_at) to claimed, on the database clock.",
                labels=["queue", "tenant"])
            for (q, t), h in self._wait.items():
                wait.add_metric([q, t], h.buckets(), h.sum)
            run = HistogramMetricFamily(
                "fairq_job_run_seconds", "Handler run time.", labels=["queue", "tenant", "task"])
            for (q, t, k), h in self._run.items():
                run.add_metric([q, t, k], h.buckets(), h.sum)
            claim = HistogramMetricFamily(
                "fairq_claim_seconds", "Claim round trip seen by the worker, by result "
                "(claimed, empty, error).", labels=["queue", "policy", "result"])
            for (q, p, r), h in self._claim.items():
                claim.add_metric([q, p, r], h.buckets(), h.sum)
            leases = CounterMetricFamily(
                "fairq_leases_expired", "Expired leases this worker's maintenance reaped.",
                labels=["queue"])
            for q, v in self._leases.items():
                leases.add_metric([q], v)
            reaped = CounterMetricFamily(
                "fairq_leases_reaped", "Expired leases this worker reaped (its maintenance or "
                "its drain), by outcome: requeued, or failed at max_attempts.",
                labels=["queue", "outcome"])
            for (q, o), v in self._reaped.items():
                reaped.add_metric([q, o], v)
            db_errors = CounterMetricFamily(
                "fairq_db_errors", "Database errors this worker met, by kind (docs/reliability.md: "
                "what each costs and what the worker does next).", labels=["kind"])
            for kind, v in self._db_errors.items():
                db_errors.add_metric([kind], v)
            reconnects = CounterMetricFamily(
                "fairq_db_reconnects", "Outages this worker came back from: the database "
                "answered again after its connections were lost (one per outage, not per "
                "connection).", value=self._reconnects)
            folded = GaugeMetricFamily(
                "fairq_metrics_tenants_folded",
                "Tenants whose worker series are folded into tenant=\"__other__\" "
                f"(top {self.fold.limit} kept, ${ENV_MAX_TENANTS}).",
                value=self.fold.folded)
        up = GaugeMetricFamily("fairq_worker_healthy",
                               "1 when the worker loop ticked recently and reported its database "
                               "connection healthy.", value=1.0 if self.loop_healthy() else 0.0)
        yield from self._fresh.zero_new((enq, claimed, finished, wait, run, claim, leases,
                                         reaped, db_errors, reconnects, folded, up))

    def serve(self, port: int, host: str = "0.0.0.0",
              health: Callable[[], bool] | None = None) -> MetricsServer:
        """Serve /metrics and /healthz; ``health`` defaults to :meth:`loop_healthy`."""
        self.server = serve(port, host, health=health or self.loop_healthy, registry=self.registry)
        return self.server


