"""fairq.otel end to end: a FastAPI app whose request handlers enqueue, then a real
``fairq worker MODULE:APP`` process whose module calls ``instrument(app)``; the trace that came
in with the request goes on, unbroken, into the job's attempt in the other process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.testclient import TestClient

import fairq
import fairq.otel
from tests.support.db import SCHEMA

# What a browser or an upstream service sends: the trace the request is part of.
INCOMING = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

# The module `fairq worker` runs: an app, its task, instrument(app) with an in-memory exporter,
# and the finished spans written to $SPANS_FILE when the process exits.
WORKER_MODULE = '''
import atexit
import json
import os

import fairq
import fairq.otel
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
app = fairq.App()


@app.task(name="report", max_attempts=1)
def report(job: fairq.Job) -> int:
    if job.payload.get("fail"):
        raise RuntimeError("report failed")
    return 2 * job.payload["n"]


fairq.otel.instrument(app, tracer_provider=provider)


@atexit.register
def write_spans() -> None:
    spans = [{"name": s.name, "kind": s.kind.name, "trace": f"{s.context.trace_id:032x}",
              "span": f"{s.context.span_id:016x}",
              "parent": None if s.parent is None else f"{s.parent.span_id:016x}",
              "status": s.status.status_code.name, "attributes": dict(s.attributes or {})}
             for s in exporter.get_finished_spans()]
    with open(os.environ["SPANS_FILE"], "w") as f:
        json.dump(spans, f)
'''


class ServerSpans:
    """A SERVER span around each request, continuing the request's traceparent (what an ASGI
    instrumentation does; the test keeps to the API and the SDK)."""

    def __init__(self, app: Any, provider: TracerProvider) -> None:
        self.app = app
        self.tracer = provider.get_tracer("web")

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        context = TraceContextTextMapPropagator().extract(headers)
        with self.tracer.start_as_current_span(f"POST {scope['path']}", context=context,
                                               kind=SpanKind.SERVER):
            await self.app(scope, receive, send)


def web_app(app: fairq.App, provider: TracerProvider) -> FastAPI:
    @asynccontextmanager
    async def lifespan(api: FastAPI) -> AsyncIterator[None]:
        yield
        await app.aclose()  # the async pool, in the loop that opened it

    api = FastAPI(lifespan=lifespan)

    @api.post("/reports/{n}")
    def make_report(n: int, fail: bool = False) -> dict[str, int]:  # a worker thread
        return {"job": app.enqueue("report", tenant="acme", payload={"n": n, "fail": fail})}

    @api.post("/async-reports/{n}")
    async def make_report_async(n: int) -> dict[str, int]:  # the event loop
        return {"job": await app.enqueue_async("report", tenant="acme", payload={"n": n})}

    api.add_middleware(ServerSpans, provider=provider)
    return api


def run_worker(dsn: str, tmp_path: Path) -> list[dict[str, Any]]:
    (tmp_path / "otel_tasks.py").write_text(textwrap.dedent(WORKER_MODULE))
    spans = tmp_path / "spans.json"
    proc = subprocess.run(
        [sys.executable, "-m", "fairq", "--dsn", dsn, "--schema", SCHEMA, "worker",
         "otel_tasks:app", "--until-empty", "--concurrency", "2"],
        cwd=tmp_path, env={**os.environ, "SPANS_FILE": str(spans)}, capture_output=True,
        text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return list(json.loads(spans.read_text()))


def test_the_request_trace_goes_on_into_the_job_in_a_worker_process(
        dsn: str, tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = fairq.App(dsn, schema=SCHEMA)
    app.task(name="report", max_attempts=1)(lambda job: None)  # the producer's side knows it
    fairq.otel.instrument(app, tracer_provider=provider)
    with TestClient(web_app(app, provider)) as client:
        sync_job = client.post("/reports/21", headers={"traceparent": INCOMING}).json()["job"]
        async_job = client.post("/async-reports/4").json()["job"]  # a trace of its own
        failed_job = client.post("/reports/1?fail=true",
                                 headers={"traceparent": INCOMING}).json()["job"]
    app.close()

    web = exporter.get_finished_spans()
    servers = [s for s in web if s.kind == SpanKind.SERVER]
    sends = {int((s.attributes or {})["messaging.message.id"]): s
             for s in web if s.kind == SpanKind.PRODUCER}
    assert len(servers) == 3 and set(sends) == {sync_job, async_job, failed_job}
    processes = {int(s["attributes"]["messaging.message.id"]): s
                 for s in run_worker(dsn, tmp_path) if s["kind"] == "CONSUMER"}
    assert set(processes) == {sync_job, async_job, failed_job}

    incoming_trace, incoming_span = INCOMING.split("-")[1:3]
    for job_id in (sync_job, failed_job):
        send, process = sends[job_id], processes[job_id]
        server = next(s for s in servers if s.context.span_id == send.parent.span_id)  # type: ignore[union-attr]
        # one trace: the caller's, the request's server span, the enqueue, the attempt
        assert server.parent is not None and f"{server.parent.span_id:016x}" == incoming_span
        assert {f"{server.context.trace_id:032x}", f"{send.context.trace_id:032x}",
                process["trace"]} == {incoming_trace}
        assert process["parent"] == f"{send.context.span_id:016x}"
        assert process["name"] == "process default"
        assert process["attributes"]["fairq.tenant"] == "acme"
    assert processes[sync_job]["status"] == "UNSET"
    assert processes[failed_job]["status"] == "ERROR"
    # A request with no trace of its own starts one, and its job continues that one.
    send = sends[async_job]
    assert processes[async_job]["trace"] == f"{send.context.trace_id:032x}" != incoming_trace
    assert processes[async_job]["parent"] == f"{send.context.span_id:016x}"
    with fairq.App(dsn, schema=SCHEMA) as check:
        assert check.job(sync_job).status == "done"  # type: ignore[union-attr]
        assert check.job(failed_job).status == "failed"  # type: ignore[union-attr]


def test_a_worker_whose_module_does_not_instrument_never_imports_opentelemetry(
        dsn: str, tmp_path: Path) -> None:
    """Off is not calling instrument: the worker process never imports OpenTelemetry."""
    (tmp_path / "plain_tasks.py").write_text(
        "import fairq\napp = fairq.App()\napp.task(name='report')(lambda job: None)\n"
        "import atexit, sys\n"
        "atexit.register(lambda: print('otel' if any(m.startswith('opentelemetry') "
        "for m in sys.modules) else 'no otel'))\n")
    with fairq.App(dsn, schema=SCHEMA) as app:
        app.task(name="report")(lambda job: None)
        app.enqueue("report", tenant="acme")
    proc = subprocess.run(
        [sys.executable, "-m", "fairq", "--dsn", dsn, "--schema", SCHEMA, "worker",
         "plain_tasks:app", "--until-empty"], cwd=tmp_path, capture_output=True, text=True,
        timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "no otel"
