"""Worker metrics for Prometheus with a bounded ``tenant`` label; the /metrics + /healthz server.

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

import bisect
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder

from fairq.fresh_series import FreshSeries
from fairq.models import ClaimedJob

if TYPE_CHECKING:
    from fairq.app import App

OTHER = "__other__"
ENV_MAX_TENANTS = "FAIRQ_METRICS_MAX_TENANTS"

WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                120.0, 300.0, 600.0, 1800.0, 3600.0)
RUN_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
               300.0, 900.0, 3600.0)
OUTCOMES = ("done", "retry", "failed", "lease_lost")
RESULTS = ("claimed", "empty", "error")
CLAIM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def max_tenants_from_env(default: int = 50) -> int:
    """``$FAIRQ_METRICS_MAX_TENANTS`` as an int >= 0; garbage is ``InvalidInput`` (CLI exit 2),
    not a silent default, so a typo cannot quietly change the metrics' cardinality."""
    from fairq.errors import InvalidInput

    raw = os.environ.get(ENV_MAX_TENANTS, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidInput(f"{ENV_MAX_TENANTS} must be an integer >= 0, not {raw[:40]!r}") from None
    if not 0 <= value <= 1_000_000:
        raise InvalidInput(f"{ENV_MAX_TENANTS} must be between 0 and 1000000, not {value}")
    return value


class Hist:
    """A fixed-bucket histogram accumulator (not thread-safe: the observer's lock guards it)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += n
        self.sum += value * n

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative buckets as prometheus-client wants them, ending with +Inf."""
        out, acc = [], 0
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            acc += count
            out.append((_le(bound), float(acc)))
        return out


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


class TenantFold:
    """Which tenants keep their own series: the top ``limit`` by decayed recent activity.

    Scores decay by half every ``rerank_seconds``; a job claimed adds 1 plus its wait in seconds
    (a tenant whose jobs wait long matters even when it is small), an enqueue or finish adds 1.
    Not thread-safe on its own: callers hold their lock.
    """

    def __init__(self, limit: int, rerank_seconds: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.rerank_seconds = rerank_seconds
        self.clock = clock
        self.live: set[str] = set()
        self.score: dict[str, float] = {}
        self.folded_seen: set[str] = set()  # tenants folded since the last re-rank
        self._next = clock() + rerank_seconds

    def label(self, tenant: str, activity: float) -> str:
        """Record ``activity`` for ``tenant`` and return the label value its series use now."""
        self.score[tenant] = self.score.get(tenant, 0.0) + activity
        if tenant in self.live:
            return tenant
        if len(self.live) < self.limit:
            self.live.add(tenant)
            return tenant
        self.folded_seen.add(tenant)
        return OTHER

    def due(self) -> bool:
        return self.clock() >= self._next

    def rerank(self) -> set[str]:
        """Decay scores, pick the new top set; returns the demoted tenants (drop their series)."""
        now = self.clock()
        periods = max(1.0, (now - self._next) / self.rerank_seconds + 1.0)
        self._next = now + self.rerank_seconds
        factor = 0.5 ** periods
        # Forget tenants whose activity has decayed to nothing: bounded memory, and an idle
        # tenant's series do not stay forever even while there is room.
        self.score = {t: s * factor for t, s in self.score.items() if s * factor >= 0.01}
        # Members get a 25% bonus: a tenant near the cut does not flap in and out.
        ranked = sorted(self.score,
                        key=lambda t: (-self.score[t] * (1.25 if t in self.live else 1.0), t))
        top = set(ranked[: self.limit])
        demoted = self.live - top
        self.live = top
        self.folded_seen = {t for t in self.score if t not in self.live}
        return demoted

    @property
    def folded(self) -> int:
        return len(self.folded_seen - self.live)


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

    def on_reap(self, queue: str, expired: int) -> None:
        with self._lock:
            queue = self._queue(queue, expired)
            self._leases[queue] = self._leases.get(queue, 0.0) + expired

    def on_loop(self, healthy: bool) -> None:
        self._last_loop = self._clock()
        self._loop_ok = healthy

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
            folded = GaugeMetricFamily(
                "fairq_metrics_tenants_folded",
                "Tenants whose worker series are folded into tenant=\"__other__\" "
                f"(top {self.fold.limit} kept, ${ENV_MAX_TENANTS}).",
                value=self.fold.folded)
        up = GaugeMetricFamily("fairq_worker_healthy",
                               "1 when the worker loop ticked recently and reported its database "
                               "connection healthy.", value=1.0 if self.loop_healthy() else 0.0)
        yield from self._fresh.zero_new((enq, claimed, finished, wait, run, claim, leases,
                                         folded, up))

    def serve(self, port: int, host: str = "0.0.0.0",
              health: Callable[[], bool] | None = None) -> MetricsServer:
        """Serve /metrics and /healthz; ``health`` defaults to :meth:`loop_healthy`."""
        self.server = serve(port, host, health=health or self.loop_healthy, registry=self.registry)
        return self.server


# -- HTTP ----------------------------------------------------------------------------------


class MetricsServer:
    """A running /metrics + /healthz server on a daemon thread."""

    def __init__(self, httpd: ThreadingHTTPServer) -> None:
        self.httpd = httpd
        self.host, self.port = httpd.server_address[0], int(httpd.server_address[1])
        self.thread = threading.Thread(target=httpd.serve_forever, name="fairq-metrics",
                                       daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        """A URL to reach the server from this host (127.0.0.1 when bound to every interface)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else str(self.host)
        return f"http://{host}:{self.port}"

    @property
    def bound_url(self) -> str:
        """The address actually bound, for logs: ``0.0.0.0`` means every interface."""
        host = str(self.host)
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


def serve(port: int, host: str = "0.0.0.0", health: Callable[[], bool] | None = None,
          registry: CollectorRegistry | None = None,
          checks: Mapping[str, Callable[[], bool]] | None = None) -> MetricsServer:
    """Serve ``registry`` on /metrics and ``health`` on /healthz (200 ok / 503 unhealthy), and
    each of ``checks`` (path -> check) likewise (see fairq.health).

    ``port=0`` picks a free port (see ``MetricsServer.port``). A health callable that raises
    counts as unhealthy. A port in use is ``InvalidInput`` naming it.
    """
    from prometheus_client import REGISTRY

    reg = registry if registry is not None else REGISTRY
    check = health or (lambda: True)
    paths = {"/healthz": check, **(checks or {})}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
                try:
                    body, status = encoder(reg), 200
                except Exception as exc:  # a failing collector: say so, do not hang up
                    body, status = f"# collect failed: {exc}\n".encode(), 500
                    content_type = "text/plain; charset=utf-8"
                self._send(status, body, content_type)
            elif path in paths:
                try:
                    ok = bool(paths[path]())
                except Exception:
                    ok = False
                self._send(200 if ok else 503, b"ok\n" if ok else b"unhealthy\n",
                           "text/plain; charset=utf-8")
            else:
                self._send(404, f"not found: try /metrics or {' '.join(sorted(paths))}\n"
                           .encode(), "text/plain")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # scrapes every few seconds would flood the worker's log

    ThreadingHTTPServer.daemon_threads = True
    try:
        httpd = ThreadingHTTPServer((host, port), Handler)
    except OSError as exc:
        import errno

        from fairq.errors import InvalidInput

        if exc.errno == errno.EADDRINUSE:
            raise InvalidInput(f"cannot serve metrics on {host}:{port}: port {port} is already "
                               "in use (choose another port)") from None
        if exc.errno in (errno.EADDRNOTAVAIL, errno.EACCES):
            raise InvalidInput(f"cannot serve metrics on {host}:{port}: {exc.strerror}") from None
        raise
    return MetricsServer(httpd)


def db_check(dsn: str, timeout: float = 2.0, cache_seconds: float = 1.0) -> Callable[[], bool]:
    """A health check that connects and runs ``SELECT 1``; cached briefly so scrapes stay cheap."""
    import psycopg

    state: dict[str, float | bool] = {"at": -math.inf, "ok": False}
    lock = threading.Lock()

    def check() -> bool:
        with lock:
            now = time.monotonic()
            if now - float(state["at"]) < cache_seconds:
                return bool(state["ok"])
            try:
                with psycopg.connect(dsn, connect_timeout=max(1, math.ceil(timeout)),
                                     autocommit=True) as conn:
                    conn.execute("SELECT 1")
                ok = True
            except Exception:
                ok = False
            state.update(at=time.monotonic(), ok=ok)
            return ok

    return check


def all_of(*checks: Callable[[], bool]) -> Callable[[], bool]:
    """Healthy when every check is."""
    return lambda: all(c() for c in checks)


def start_worker_metrics(app: App, *, host: str = "0.0.0.0", port: int = 0,
                         max_tenants: int | None = None) -> PrometheusObserver:
    """What ``fairq worker --metrics-port`` installs: an observer plus its server.

    /livez is 200 while the worker loop turns, database or not; /readyz and /healthz are 200
    while it reaches the database and a ``SELECT 1`` answers (see fairq.health).
    """
    from fairq.health import worker_checks

    observer = PrometheusObserver(max_tenants=max_tenants)
    checks = worker_checks(observer, db_check(app.dsn))
    observer.server = serve(port, host, health=checks["/healthz"], registry=observer.registry,
                            checks=checks)
    app.observer = observer  # enqueues made by this process's handlers are counted too
    return observer
