"""Overhead of tracing (fairq.otel) on enqueue and drain: the same jobs enqueued and drained by
an in-process worker with ``fairq.otel.instrument`` and without it, alternating rounds in one
run so drift in the machine or the database hits both sides alike.

    python -m benchmarks.otel_overhead [--dsn URL] [--rounds 5] [--jobs 10000] [--concurrency 8]
                                       [--sleep-ms 0]

Traced: the jobs are enqueued in a span (``enqueue_many`` in chunks of ``--chunk``), each
stores its context (job_traces) and each attempt reads it and runs in a span; spans go to the
SDK's BatchSpanProcessor with an exporter that drops them (the SDK's cost, not a network's).
Untraced: an app never instrumented (no span, no row, no read). The handler does nothing (the
worst case: all that is measured is fairq's and tracing's own work), or sleeps ``--sleep-ms``
(a handler waiting on I/O). The database is a fresh one
created next to ``--dsn`` (default ``$FAIRQ_DATABASE_URL`` or the local test server) and dropped
afterwards. Prints each round's rates, the medians and the paired ratios (traced / untraced).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import statistics
import sys
import time
from collections.abc import Sequence

import psycopg
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import fairq
import fairq.otel
from fairq import migrate

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


class Dropped(SpanExporter):
    """Counts the spans and drops them."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


def with_db(dsn: str, name: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = name
    return make_conninfo(**params)  # type: ignore[arg-type]


def make_app(dsn: str, sleep_s: float) -> fairq.App:
    app = fairq.App(dsn, schema="fairq", pool_size=8)

    @app.task(name="noop", lease=60)
    def noop(job: fairq.Job) -> None:
        if sleep_s:
            time.sleep(sleep_s)

    return app


def run_round(app: fairq.App, provider: TracerProvider | None, jobs: int, tenants: int,
              chunk: int, concurrency: int) -> tuple[float, float]:
    """Enqueue ``jobs`` (in a span when traced) and drain them; (enqueued/s, drained/s)."""
    items = [(f"tenant{i % tenants:03d}", {}) for i in range(jobs)]
    started = time.perf_counter()
    if provider is not None:
        with provider.get_tracer("bench").start_as_current_span("request"):
            for i in range(0, jobs, chunk):
                app.enqueue_many("noop", items[i:i + chunk])
    else:
        for i in range(0, jobs, chunk):
            app.enqueue_many("noop", items[i:i + chunk])
    enqueued = time.perf_counter() - started
    worker = app.worker(concurrency=concurrency, policy="weighted", poll_interval=1.0)
    started = time.perf_counter()
    worker.run(until_empty=True)
    drained = time.perf_counter() - started
    if worker.stats.done != jobs:
        raise SystemExit(f"drained {worker.stats.done} of {jobs} jobs")
    return jobs / enqueued, jobs / drained


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", default=os.environ.get("FAIRQ_DATABASE_URL") or DEFAULT_DSN)
    ap.add_argument("--rounds", type=int, default=5, help="rounds per side (default 5)")
    ap.add_argument("--jobs", type=int, default=10_000, help="jobs per round (default 10,000)")
    ap.add_argument("--tenants", type=int, default=20)
    ap.add_argument("--chunk", type=int, default=100,
                    help="jobs per enqueue_many call, each one span when traced (default 100)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--sleep-ms", type=float, default=0.0,
                    help="each handler sleeps this long (default 0: does nothing)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    logging.getLogger("fairq").setLevel(logging.WARNING)

    name = f"fairq_bench_otel_{secrets.token_hex(4)}"
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    dsn = with_db(args.dsn, name)
    exporter = Dropped()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=65536))
    sides: dict[str, tuple[list[float], list[float]]] = {"traced": ([], []), "untraced": ([], [])}
    try:
        migrate.upgrade(dsn, "fairq")
        plain, traced = make_app(dsn, args.sleep_ms / 1000), make_app(dsn, args.sleep_ms / 1000)
        fairq.otel.instrument(traced, tracer_provider=provider)
        plain.tenants.set_defaults(weight=1.0, max_running=1_000_000)  # no caps: measure work
        for app, prov in ((plain, None), (traced, provider)):  # warm-up, one of each
            run_round(app, prov, min(args.jobs, 2000), args.tenants, args.chunk, args.concurrency)
        for i in range(args.rounds):
            order = [("traced", traced, provider), ("untraced", plain, None)]
            for side, app, prov in order if i % 2 == 0 else order[::-1]:
                enq, drain = run_round(app, prov, args.jobs, args.tenants, args.chunk,
                                       args.concurrency)
                sides[side][0].append(enq)
                sides[side][1].append(drain)
        provider.force_flush()
        with psycopg.connect(dsn) as conn:
            rows = conn.execute("SELECT count(*) FROM fairq.job_traces").fetchone()
        plain.close()
        traced.close()
    finally:
        provider.shutdown()
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                pgsql.Identifier(name)))

    def ratio(kind: int) -> float:  # adjacent rounds see the same state: compare them pairwise
        return statistics.median(t / u for t, u in zip(sides["traced"][kind],
                                                       sides["untraced"][kind], strict=True))

    result = {
        "jobs_per_round": args.jobs, "rounds_per_side": args.rounds, "chunk": args.chunk,
        "concurrency": args.concurrency, "tenants": args.tenants, "sleep_ms": args.sleep_ms,
        "enqueue_traced_jobs_per_s": [round(x) for x in sides["traced"][0]],
        "enqueue_untraced_jobs_per_s": [round(x) for x in sides["untraced"][0]],
        "drain_traced_jobs_per_s": [round(x) for x in sides["traced"][1]],
        "drain_untraced_jobs_per_s": [round(x) for x in sides["untraced"][1]],
        "enqueue_median_traced": round(statistics.median(sides["traced"][0])),
        "enqueue_median_untraced": round(statistics.median(sides["untraced"][0])),
        "drain_median_traced": round(statistics.median(sides["traced"][1])),
        "drain_median_untraced": round(statistics.median(sides["untraced"][1])),
        "enqueue_paired_ratio": round(ratio(0), 3),
        "drain_paired_ratio": round(ratio(1), 3),
        "spans_exported": exporter.spans,
        "trace_rows_left": rows[0] if rows else None,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key:28} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
