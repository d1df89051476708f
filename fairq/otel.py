"""Trace context from an enqueue to its job's attempts (docs/tracing.md).

``instrument(app)`` wraps the app's sink so that each enqueue runs in a PRODUCER span
(``send <queue>``) whose W3C trace context is stored with every job of the call, in the
enqueue's transaction (the table job_traces), and adds an attempt hook that runs each attempt
in a CONSUMER span (``process <queue>``) whose parent is that stored context. An app that is
not instrumented pays nothing: no span, no row, no read. OpenTelemetry is imported here only,
and only when ``instrument`` is called (``pip install 'fairq[otel]'``).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from fairq._version import __version__
from fairq.app.ports import JobSink
from fairq.errors import InvalidInput
from fairq.job import Job
from fairq.models import NewJobColumns, TraceContext
from fairq.store.traces import claim_traces

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from fairq.app import App

__all__ = ["AttemptTracer", "ClaimReads", "TracingSink", "instrument", "uninstrument"]

log = logging.getLogger("fairq.otel")

INSTALL = "pip install 'fairq[otel]'"
SYSTEM = "fairq"  # messaging.system
MAX_TRACESTATE = 512  # job_traces_tracestate_check; the W3C's minimum to pass on
_MAX_MEMBER = 128  # tracestate members longer than this are the first to go (W3C)


def instrument(app: App, tracer_provider: TracerProvider | None = None) -> None:
    """Trace ``app``'s enqueues and its workers' attempts with OpenTelemetry: spans from
    ``tracer_provider`` (None: the global one, as set now or later). Idempotent: a second call
    changes the tracer, never adds a second span. Call it where the app is made (the module
    ``fairq worker MODULE:APP`` imports, the web app's start-up)."""
    tracer = _tracer(tracer_provider)
    if isinstance(app.sink, TracingSink):
        app.sink.tracer = tracer
    else:
        app.sink = TracingSink(app.sink, tracer)
    for hook in app.attempt_hooks:
        if isinstance(hook, AttemptTracer):
            hook.tracer = tracer
            break
    else:
        app.attempt_hooks.append(AttemptTracer(app, tracer))


def uninstrument(app: App) -> None:
    """Undo ``instrument``: the app's sink and hooks as they were (a no-op if never called)."""
    if isinstance(app.sink, TracingSink):
        app.sink = app.sink.inner
    app.attempt_hooks[:] = [h for h in app.attempt_hooks if not isinstance(h, AttemptTracer)]


def _tracer(provider: TracerProvider | None) -> Tracer:
    """fairq's tracer, or ``InvalidInput`` (one line) when OpenTelemetry is not installed."""
    try:
        from opentelemetry import trace
    except ImportError:
        raise InvalidInput(f"fairq.otel needs OpenTelemetry's API: {INSTALL}") from None
    return trace.get_tracer("fairq", __version__, tracer_provider=provider)


def _propagator() -> Any:
    """The W3C Trace Context propagator, whatever the global one is (B3, a composite...): the
    stored text is a traceparent, which every producer and the SQL function agree on."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator()


def fit_tracestate(state: str | None) -> str | None:
    """``state`` cut to at most 512 characters as the W3C says: members over 128 characters
    go first, then members from the end; None if nothing is left."""
    if not state:
        return None
    if len(state) <= MAX_TRACESTATE:
        return state
    members = [m.strip() for m in state.split(",") if m.strip()]
    members = [m for m in members if len(m) <= _MAX_MEMBER]
    while members and len(",".join(members)) > MAX_TRACESTATE:
        members.pop()
    return ",".join(members) or None


def current_trace(context: Context | None = None) -> TraceContext | None:
    """The W3C trace context of ``context``'s span (None: the current one), as stored with a
    job; None when there is no valid span."""
    carrier: dict[str, str] = {}
    _propagator().inject(carrier, context=context)
    parent = carrier.get("traceparent")
    if parent is None:
        return None
    return TraceContext(parent, fit_tracestate(carrier.get("tracestate")))


def _uniform(values: Any) -> Any:
    """The value every element of ``values`` shares, else None."""
    first = values[0] if len(values) else None
    return first if first is not None and all(v == first for v in values) else None


class _Sent:
    """What one enqueue call sent, gathered as its chunks are made: for the span's attributes."""

    def __init__(self, first: NewJobColumns) -> None:
        self.queue: str = first.queues[0]
        self.task = _uniform(first.tasks)
        self.tenant = _uniform(first.tenants)

    def add(self, jobs: NewJobColumns) -> None:
        if self.task is not None and _uniform(jobs.tasks) != self.task:
            self.task = None
        if self.tenant is not None and _uniform(jobs.tenants) != self.tenant:
            self.tenant = None

    def chunks(self, first: NewJobColumns, rest: Iterator[NewJobColumns]
               ) -> Iterator[NewJobColumns]:
        yield first
        for jobs in rest:
            self.add(jobs)
            yield jobs

    def attributes(self) -> dict[str, Any]:
        """The span's attributes known before anything is sent (an enqueue has one queue)."""
        return {"messaging.system": SYSTEM, "messaging.operation.type": "send",
                "messaging.operation.name": "send", "messaging.destination.name": self.queue,
                "fairq.queue": self.queue}


class TracingSink:
    """A ``JobSink`` that sends each enqueue in a PRODUCER span and hands the inner sink that
    span's trace context to store with the jobs (``fairq.app.ports.JobSink``)."""

    def __init__(self, inner: JobSink, tracer: Tracer) -> None:
        self.inner = inner
        self.tracer = tracer

    def put(self, chunks: Iterator[NewJobColumns], *, connection: Any,
            trace: TraceContext | None) -> list[int]:
        rest = iter(chunks)
        first = next(rest, None)  # made and checked before the span: nothing sent, no span
        if first is None or not len(first):
            return self.inner.put(iter(()), connection=connection, trace=trace)
        sent = _Sent(first)
        with self._span(sent) as span:
            ids = self.inner.put(sent.chunks(first, rest), connection=connection,
                                 trace=trace or current_trace())
            _sent(span, sent, ids)
        return ids

    async def put_async(self, jobs: NewJobColumns, *, connection: Any,
                        trace: TraceContext | None) -> list[int]:
        if not len(jobs):
            return await self.inner.put_async(jobs, connection=connection, trace=trace)
        sent = _Sent(jobs)
        with self._span(sent) as span:
            ids = await self.inner.put_async(jobs, connection=connection,
                                             trace=trace or current_trace())
            _sent(span, sent, ids)
        return ids

    def _span(self, sent: _Sent) -> AbstractContextManager[Span]:
        from opentelemetry.trace import SpanKind

        return self.tracer.start_as_current_span(
            f"send {sent.queue}", kind=SpanKind.PRODUCER, attributes=sent.attributes())


def _sent(span: Span, sent: _Sent, ids: list[int]) -> None:
    """The attributes known once every chunk was made: the task and the tenant if all the jobs
    share them, the job's id (one job) or how many (a batch)."""
    if sent.task is not None:
        span.set_attribute("fairq.task", sent.task)
    if sent.tenant is not None:
        span.set_attribute("fairq.tenant", sent.tenant)
    if len(ids) == 1:
        span.set_attribute("messaging.message.id", str(ids[0]))
    else:
        span.set_attribute("messaging.batch.message_count", len(ids))


class AttemptTracer:
    """The attempt hook (``App.attempt_hooks``): each attempt in a CONSUMER span whose parent
    is the trace context stored with its job, linked to it too (docs/tracing.md says why)."""

    def __init__(self, app: App, tracer: Tracer) -> None:
        self.app = app
        self.tracer = tracer
        self._propagator = _propagator()
        self._reads = ClaimReads(app)

    def __call__(self, job: Job) -> AbstractContextManager[object]:
        return self._attempt(job)

    @contextmanager
    def _attempt(self, job: Job) -> Iterator[Span]:
        from opentelemetry import trace
        from opentelemetry.trace import Link, SpanKind

        parent: Context | None = None  # no stored context: the current one (none in a worker)
        links: list[Link] = []
        stored = self._reads.get(job)
        if stored is not None:
            carrier: Mapping[str, str] = (
                {"traceparent": stored.traceparent} if stored.tracestate is None
                else {"traceparent": stored.traceparent, "tracestate": stored.tracestate})
            extracted = self._propagator.extract(carrier)
            context = trace.get_current_span(extracted).get_span_context()
            if context.is_valid:
                parent, links = extracted, [Link(context)]
        with self.tracer.start_as_current_span(
                f"process {job.queue}", context=parent, kind=SpanKind.CONSUMER, links=links,
                attributes=_attempt_attributes(job)) as span:
            try:
                yield span
            except BaseException as exc:  # recorded (ERROR) by the span as it ends; re-raised
                span.set_attribute("error.type", type(exc).__qualname__)
                raise


class ClaimReads:
    """The stored contexts of attempts, read a claim's batch at a time: the first attempt of a
    batch reads those of every job the claim took (``claim_traces``), the others find theirs
    here. A job's context never changes, so what is kept is never stale; at most ``KEEP``
    jobs' are kept (those of jobs that never start here: handed back, taken by a reaper)."""

    KEEP = 10_000

    def __init__(self, app: App) -> None:
        self.app = app
        self._lock = threading.Lock()
        self._known: OrderedDict[int, TraceContext | None] = OrderedDict()
        self._reading: dict[tuple[datetime, datetime], threading.Event] = {}
        self._read: OrderedDict[tuple[datetime, datetime], None] = OrderedDict()  # batches done
        self._warned = False

    def get(self, job: Job) -> TraceContext | None:
        """The job's stored context; None for an inline job (fairq.testing: never stored, its
        enqueue's span is the current one) and, logged once, when it cannot be read."""
        if job.id < 0:
            return None
        try:
            return self._get(job)
        except Exception as exc:  # tracing never fails a job
            if not self._warned:
                self._warned = True
                log.warning("fairq.otel: cannot read the trace context of job %s (%s: %s); "
                            "attempts whose context cannot be read start new traces", job.id,
                            type(exc).__name__, (str(exc).strip().splitlines() or [""])[0])
            return None

    def _get(self, job: Job) -> TraceContext | None:
        key = (job.started_at, job.locked_until)
        with self._lock:
            if job.id in self._known:
                return self._known.pop(job.id)
            reading = self._reading.get(key)
            if reading is None and key not in self._read:
                reading = self._reading[key] = threading.Event()
                mine = True
            else:
                mine = False
        if mine:
            assert reading is not None
            found: dict[int, TraceContext | None] = {}
            try:
                found = claim_traces(self.app.store, job.started_at, job.locked_until)
            finally:  # kept before the others waiting are woken
                with self._lock:
                    self._known.update(found)
                    self._read[key] = None
                    del self._reading[key]
                    for kept in (self._known, self._read):
                        while len(kept) > self.KEEP:
                            kept.popitem(last=False)
                reading.set()
        elif reading is not None:
            reading.wait(5.0)  # another attempt of the batch is reading it
        with self._lock:
            if job.id in self._known:
                return self._known.pop(job.id)
        # Not in its batch (or the batch could not be read): its lease moved since the claim.
        return self.app.store.job_trace(job.id)


def _attempt_attributes(job: Job) -> dict[str, Any]:
    return {
        "messaging.system": SYSTEM, "messaging.operation.type": "process",
        "messaging.operation.name": "process", "messaging.destination.name": job.queue,
        "messaging.message.id": str(job.id), "fairq.queue": job.queue,
        "fairq.tenant": job.tenant, "fairq.task": job.task, "fairq.attempt": job.attempt,
        "fairq.wait_s": job.claimed.wait_seconds,
    }
