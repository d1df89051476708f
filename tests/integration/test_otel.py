"""fairq.otel (docs/tracing.md): an enqueue inside a span stores its W3C trace context with
its jobs, in the enqueue's transaction, and each attempt runs in a CONSUMER span continuing
that trace; SQL producers store one through trace_jobs; garbage is refused in one line; the
contexts go with their jobs; an app not instrumented writes and reads nothing."""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Iterator

import psycopg
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import fairq
import fairq.otel
from fairq import migrate, sql
from fairq.errors import InvalidInput
from fairq.models import NewJob, NewJobColumns, TraceContext
from fairq.schema import engine_ddl
from fairq.store.enqueue import CHUNK
from fairq.testing import drain
from tests.support.catalog import differences, snapshot
from tests.support.db import SCHEMA

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Traced:
    """An instrumented app, its spans (in memory) and a tracer to make the caller's spans."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("test")
        self.app = fairq.App(dsn, schema=SCHEMA)

        @self.app.task(name="ok", max_attempts=1)
        def ok(job: fairq.Job) -> int:
            return 1

        @self.app.task(name="boom", max_attempts=1)
        def boom(job: fairq.Job) -> None:
            raise ValueError("no good")

        fairq.otel.instrument(self.app, tracer_provider=self.provider)

    def spans(self, kind: SpanKind) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.kind == kind]

    def rows(self) -> dict[int, tuple[str, str | None]]:
        with psycopg.connect(self.dsn) as conn:
            return {r[0]: (r[1], r[2]) for r in conn.execute(
                "SELECT job_id, traceparent, tracestate FROM fairq.job_traces")}


@pytest.fixture
def traced(dsn: str) -> Iterator[Traced]:
    t = Traced(dsn)
    try:
        yield t
    finally:
        t.app.close()


def parent_of(span: ReadableSpan) -> str:
    """The traceparent a span's context makes (what is stored for jobs sent in it)."""
    c = span.get_span_context()
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}"


def test_an_enqueue_in_a_span_stores_the_producer_spans_context(traced: Traced) -> None:
    with traced.tracer.start_as_current_span("request") as request:
        job_id = traced.app.enqueue("ok", tenant="acme")
    [send] = traced.spans(SpanKind.PRODUCER)
    assert send.name == "send default"
    assert send.parent is not None and send.parent.span_id == request.get_span_context().span_id
    assert send.context.trace_id == request.get_span_context().trace_id
    assert dict(send.attributes or {}) == {
        "messaging.system": "fairq", "messaging.operation.type": "send",
        "messaging.operation.name": "send", "messaging.destination.name": "default",
        "messaging.message.id": str(job_id), "fairq.queue": "default", "fairq.task": "ok",
        "fairq.tenant": "acme"}
    assert traced.rows() == {job_id: (parent_of(send), None)}


def test_attempts_continue_the_enqueue_trace_in_a_worker(traced: Traced) -> None:
    with traced.tracer.start_as_current_span("request"):
        job_id = traced.app.enqueue("ok", tenant="acme")
    traced.app.worker(concurrency=2, policy="fifo").run(until_empty=True)
    [send] = traced.spans(SpanKind.PRODUCER)
    [process] = traced.spans(SpanKind.CONSUMER)
    assert process.name == "process default"
    assert process.context.trace_id == send.context.trace_id
    assert process.parent is not None and process.parent.span_id == send.context.span_id
    assert [link.context.span_id for link in process.links] == [send.context.span_id]
    attrs = dict(process.attributes or {})
    assert attrs.pop("fairq.wait_s") >= 0  # type: ignore[operator]
    assert attrs == {
        "messaging.system": "fairq", "messaging.operation.type": "process",
        "messaging.operation.name": "process", "messaging.destination.name": "default",
        "messaging.message.id": str(job_id), "fairq.queue": "default", "fairq.tenant": "acme",
        "fairq.task": "ok", "fairq.attempt": 1}
    assert process.status.status_code is StatusCode.UNSET
    assert traced.app.job(job_id).status == "done"  # type: ignore[union-attr]


def test_a_failed_attempt_is_recorded_on_its_span_and_still_fails(traced: Traced) -> None:
    with traced.tracer.start_as_current_span("request"):
        job_id = traced.app.enqueue("boom", tenant="acme")
    [outcome] = drain(traced.app)
    assert outcome.status == "failed" and isinstance(outcome.error, ValueError)
    [process] = traced.spans(SpanKind.CONSUMER)
    assert process.status.status_code is StatusCode.ERROR
    assert "no good" in (process.status.description or "")
    assert (process.attributes or {})["error.type"] == "ValueError"
    [event] = [e for e in process.events if e.name == "exception"]
    assert (event.attributes or {})["exception.type"] == "ValueError"
    info = traced.app.job(job_id)
    assert info is not None and info.status == "failed" and "no good" in (info.last_error or "")


def test_a_sql_producer_stores_a_context_with_trace_jobs(traced: Traced) -> None:
    """Another language's producer: enqueue, then trace_jobs, in its own transaction."""
    with psycopg.connect(traced.dsn) as conn:
        [(job_id,)] = conn.execute(
            "SELECT fairq.enqueue(task => 'ok', tenant => 'sqlshop')").fetchall()
        [(n,)] = conn.execute("SELECT fairq.trace_jobs(ARRAY[%s::bigint], %s, %s)",
                              (job_id, PARENT, "vendor=abc")).fetchall()
        assert n == 1
        # again (as an enqueue with a key that found this job would): the first one stays
        [(n,)] = conn.execute("SELECT fairq.trace_jobs(ARRAY[%s::bigint], %s)",
                              (job_id, PARENT.replace("00f0", "1111"))).fetchall()
        assert n == 0
    assert traced.rows() == {job_id: (PARENT, "vendor=abc")}
    drain(traced.app)
    [process] = traced.spans(SpanKind.CONSUMER)
    assert f"{process.context.trace_id:032x}" == PARENT.split("-")[1]
    assert process.parent is not None and f"{process.parent.span_id:016x}" == PARENT.split("-")[2]
    assert process.context.trace_state.to_header() == "vendor=abc"


def test_a_rolled_back_enqueue_leaves_no_context(traced: Traced) -> None:
    with psycopg.connect(traced.dsn) as conn, traced.tracer.start_as_current_span("r"):
        kept = traced.app.enqueue("ok", tenant="a", connection=conn)
        conn.commit()
        traced.app.enqueue("ok", tenant="a", connection=conn)
        # several chunks down the caller's connection's pipeline
        traced.app.enqueue_many("ok", [("a", {})] * (CHUNK + 1), connection=conn)
        with psycopg.connect(traced.dsn) as other:  # written, in the caller's transaction
            assert other.execute("SELECT count(*) FROM fairq.job_traces").fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM fairq.job_traces").fetchone() == (CHUNK + 3,)
        conn.rollback()
    assert set(traced.rows()) == {kept}
    with psycopg.connect(traced.dsn) as conn:
        assert conn.execute("SELECT count(*) FROM fairq.jobs").fetchone() == (1,)


def test_every_enqueue_path_stores_a_context_for_every_job(traced: Traced) -> None:
    app = traced.app
    with traced.tracer.start_as_current_span("r"):
        ids = [app.enqueue("ok", tenant="a")]
        ids += app.enqueue_many("ok", [("a", {}), ("b", {})])
        ids += app.enqueue_many("ok", [(f"t{i % 3}", {}) for i in range(CHUNK * 2 + 1)])

        async def run() -> list[int]:
            one = await app.enqueue_async("ok", tenant="c")
            many = await app.enqueue_many_async("ok", [("c", {})] * (CHUNK + 1))
            await app.aclose()
            return [one, *many]

        ids += asyncio.run(run())
    sends = traced.spans(SpanKind.PRODUCER)
    assert len(sends) == 5
    rows = traced.rows()
    assert sorted(rows) == sorted(ids)
    by_span = {parent_of(s): s for s in sends}
    assert {tp for tp, _ in rows.values()} == set(by_span)
    counts = sorted(dict(s.attributes or {}).get("messaging.batch.message_count", 1)
                    for s in sends)
    assert counts == [1, 1, 2, CHUNK + 1, CHUNK * 2 + 1]
    many = next(s for s in sends if (s.attributes or {}).get("messaging.batch.message_count")
                == CHUNK * 2 + 1)
    assert "fairq.tenant" not in (many.attributes or {})  # three tenants: none named


def test_a_key_that_finds_the_live_job_keeps_its_first_context(traced: Traced) -> None:
    with traced.tracer.start_as_current_span("first"):
        first = traced.app.enqueue("ok", tenant="a", key="k")
    with traced.tracer.start_as_current_span("second"):
        again = traced.app.enqueue_many("ok", [("a", {}, "k"), ("a", {}, "k"), ("b", {}, "k")])
    assert again[:2] == [first, first]
    sends = {s.parent.span_id: s for s in traced.spans(SpanKind.PRODUCER)  # type: ignore[union-attr]
             if s.parent is not None}
    [one, many] = sorted(sends.values(), key=lambda s: s.start_time or 0)
    assert traced.rows() == {first: (parent_of(one), None), again[2]: (parent_of(many), None)}


def test_garbage_is_refused_in_one_line_in_python_and_in_sql(traced: Traced) -> None:
    job = NewJob(task="ok", tenant="a", payload_json="{}")
    store = traced.app.store
    bad = ["", "garbage", PARENT.upper(), PARENT + "-00", "ff" + PARENT[2:],
           "00-" + "0" * 32 + PARENT[35:], PARENT[:36] + "0" * 16 + PARENT[52:],
           PARENT[:-1] + "\n", "x" * 5000]
    for value in bad:
        with pytest.raises(InvalidInput, match="traceparent must be a W3C traceparent, 55 ") as e:
            store.enqueue([job], trace=TraceContext(value))
        assert "\n" not in str(e.value)
        with pytest.raises(InvalidInput, match="55 characters"):
            asyncio.run(traced.app.astore.enqueue(NewJobColumns.of([job]),
                                                   trace=TraceContext(value)))
    # Refused before anything reaches the caller's transaction, which goes on.
    with psycopg.connect(traced.dsn) as conn:
        with pytest.raises(InvalidInput, match="55 characters"):
            store.enqueue([job, job], conn, trace=TraceContext("garbage"))
        assert conn.execute("SELECT count(*) FROM fairq.jobs").fetchone() == (0,)
    with pytest.raises(InvalidInput, match="tracestate must be at most 512 characters, not 513"):
        store.enqueue([job], trace=TraceContext(PARENT, "k=" + "v" * 511))
    with pytest.raises(InvalidInput, match="tracestate must be printable ASCII"):
        store.enqueue([job], trace=TraceContext(PARENT, "k=v\n"))
    with psycopg.connect(traced.dsn) as conn:
        assert conn.execute("SELECT count(*) FROM fairq.jobs").fetchone() == (0,)
    # The SQL function: the same lines (FQ001), nothing written; the table's checks behind it.
    with psycopg.connect(traced.dsn, autocommit=True) as conn:
        [(job_id,)] = conn.execute("SELECT fairq.enqueue(task => 'ok', tenant => 'a')").fetchall()
        for value, message in [
                ("garbage", "traceparent must be a W3C traceparent, 55 characters"),
                ("x\ny" * 40, "... (120 characters)"), (None, "traceparent must not be null")]:
            with pytest.raises(psycopg.Error, match=re.escape(message)) as err:
                conn.execute("SELECT fairq.trace_jobs(ARRAY[%s::bigint], %s)", (job_id, value))
            assert err.value.sqlstate == "FQ001" and "\n" not in (err.value.diag.message_primary
                                                                  or "\n")
        for args, message in [((job_id, PARENT, "k=" + "v" * 511), "at most 512 characters"),
                              ((job_id + 1000, PARENT, None), f"no job {job_id + 1000}")]:
            with pytest.raises(psycopg.Error, match=message):
                conn.execute("SELECT fairq.trace_jobs(ARRAY[%s::bigint], %s, %s)", args)
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("INSERT INTO fairq.job_traces VALUES (%s, %s)", (job_id, PARENT + "0"))
        assert conn.execute("SELECT count(*) FROM fairq.job_traces").fetchone() == (0,)


def sweep_mark(dsn: str) -> str | None:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT value->>'after' FROM fairq.settings "
                           "WHERE key = 'maintenance:trace_sweep'").fetchone()
    return None if row is None else str(row[0])


def test_the_pruner_takes_the_contexts_with_their_jobs_and_sweeps_the_rest(
        traced: Traced) -> None:
    app = traced.app
    with traced.tracer.start_as_current_span("r"):
        ids = app.enqueue_many("ok", [("a", {})] * 5)
    drain(app)
    with psycopg.connect(traced.dsn, autocommit=True) as conn:
        conn.execute("UPDATE fairq.jobs SET finished_at = now() - interval '1 day' "
                     "WHERE id = ANY(%s)", (ids[:2],))
        # a job deleted some other way than the pruner (by hand, an older release's pruner)
        conn.execute("DELETE FROM fairq.jobs WHERE id = %s", (ids[4],))
    assert app.store.prune_finished(3600) == 2
    assert sorted(traced.rows()) == [ids[2], ids[3]]  # those of the pruned, and the orphan
    assert sweep_mark(traced.dsn) == "0"  # it read them all: the next starts from the front


def test_an_untraced_prune_writes_no_sweep_mark(dsn: str, store: fairq.store.Store) -> None:
    store.enqueue([NewJob(task="ok", tenant="a", payload_json="{}")])
    assert store.prune_finished(0) == 0
    assert sweep_mark(dsn) is None


def test_the_sweep_goes_on_from_where_it_stopped(traced: Traced) -> None:
    with traced.tracer.start_as_current_span("r"):
        ids = traced.app.enqueue_many("ok", [("a", {})] * 6)
    with psycopg.connect(traced.dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM fairq.jobs WHERE id = ANY(%s)", ([ids[1], ids[4]],))
    store = traced.app.store
    assert store.prune_finished(3600, limit=3) == 0  # looked at ids[0..2]
    assert sorted(traced.rows()) == [ids[0], ids[2], ids[3], ids[4], ids[5]]
    assert sweep_mark(traced.dsn) == str(ids[2])
    assert store.prune_finished(3600, limit=3) == 0  # ids[3..5]
    assert sorted(traced.rows()) == [ids[0], ids[2], ids[3], ids[5]]
    assert store.prune_finished(3600, limit=3) == 0  # nothing after ids[5]: from the front
    assert sweep_mark(traced.dsn) == "0"


def test_an_app_not_instrumented_writes_no_context(dsn: str) -> None:
    t = Traced(dsn)
    fairq.otel.uninstrument(t.app)
    assert t.app.attempt_hooks == [] and not isinstance(t.app.sink, fairq.otel.TracingSink)
    try:
        with t.tracer.start_as_current_span("r"):
            t.app.enqueue("ok", tenant="a")
        drain(t.app)
        assert t.rows() == {} and t.exporter.get_finished_spans()[0].name == "r"
        assert len(t.exporter.get_finished_spans()) == 1
    finally:
        t.app.close()


def test_instrumenting_twice_does_not_double(traced: Traced) -> None:
    fairq.otel.instrument(traced.app, tracer_provider=traced.provider)
    assert len(traced.app.attempt_hooks) == 1
    assert not isinstance(traced.app.sink.inner, fairq.otel.TracingSink)  # type: ignore[attr-defined]
    with traced.tracer.start_as_current_span("r"):
        traced.app.enqueue("ok", tenant="a")
    drain(traced.app)
    assert len(traced.spans(SpanKind.PRODUCER)) == 1
    assert len(traced.spans(SpanKind.CONSUMER)) == 1


def test_a_no_op_tracer_stores_the_callers_context_or_nothing(traced: Traced) -> None:
    """With the API alone (no SDK: a no-op tracer) the enqueue's span is the caller's: its
    context is stored if it has one, else nothing is."""
    from opentelemetry.trace import NoOpTracerProvider

    t = fairq.App(traced.dsn, schema=SCHEMA)
    t.task(name="ok")(lambda job: None)
    fairq.otel.instrument(t, tracer_provider=NoOpTracerProvider())
    try:
        alone = t.enqueue("ok", tenant="a")
        with traced.tracer.start_as_current_span("request") as request:
            inside = t.enqueue("ok", tenant="a")
        assert alone not in traced.rows()
        assert traced.rows() == {inside: (parent_of(request), None)}  # type: ignore[arg-type]
    finally:
        t.close()


def test_instrument_without_opentelemetry_says_what_to_install(
        monkeypatch: pytest.MonkeyPatch, dsn: str) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    app = fairq.App(dsn, schema=SCHEMA)
    with pytest.raises(InvalidInput, match=re.escape("pip install 'fairq[otel]'")) as e:
        fairq.otel.instrument(app)
    assert "\n" not in str(e.value) and app.attempt_hooks == []


def test_the_long_tracestate_is_cut_as_the_w3c_says() -> None:
    long = ",".join(f"k{i}=" + "v" * 40 for i in range(20))  # 20 members of 43: 879 characters
    cut = fairq.otel.fit_tracestate(long)
    assert cut is not None and len(cut) <= 512 and long.startswith(cut)
    assert fairq.otel.fit_tracestate("a=" + "x" * 600 + ",b=1") == "b=1"
    assert fairq.otel.fit_tracestate("") is None


def test_the_traced_enqueue_makes_the_same_call_as_the_enqueue() -> None:
    """enqueue_traced repeats the enqueue statement's call: they must not drift apart."""
    def call(name: str) -> str:
        text = sql.statement(name, SCHEMA)
        start = text.index('SELECT "fairq".enqueue_many(')
        return text[start:text.index(") AS ids", start)]

    assert call("enqueue_traced") == call("enqueue")


def test_0003_downgrades_and_upgrades_back_to_the_engine(empty_dsn: str) -> None:
    migrate.upgrade(empty_dsn, "fq_chain")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute('INSERT INTO fq_chain.settings VALUES (\'maintenance:trace_sweep\', \'{}\')')
    migrate.downgrade(empty_dsn, "fq_chain", "0002")
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute("SELECT to_regclass('fq_chain.job_traces'), "
                            "to_regprocedure('fq_chain.trace_jobs(bigint[], text, text)'), "
                            "(SELECT count(*) FROM fq_chain.settings WHERE key LIKE "
                            "'maintenance:trace%')").fetchone() == (None, None, 0)
    migrate.upgrade(empty_dsn, "fq_chain")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        with conn.transaction():
            conn.execute('CREATE SCHEMA "fq_engine"')
            for ddl in engine_ddl("fq_engine"):
                conn.execute(ddl)
        assert differences(snapshot(conn, "fq_chain"), snapshot(conn, "fq_engine")) == []


@pytest.fixture(scope="module")
def role_dsns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A private cluster where an owner migrated and applied ``fairq roles`` for a producer
    and a pruning worker (docs/roles.md)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from fairq.cli import main
    from tests.support.fault_tools import private_cluster
    from tests.support.fault_tools import sql as run

    with private_cluster(tmp_path_factory.mktemp("otel_roles")) as holder:
        su = holder[0].dsn
        for role in ("fq_owner", "fq_worker", "fq_producer"):
            run(su, f"CREATE ROLE {role} LOGIN")
        run(su, "CREATE DATABASE app")
        params = conninfo_to_dict(su)
        params["dbname"] = "app"
        run(make_conninfo(**params), "GRANT CREATE ON DATABASE app TO fq_owner")  # type: ignore[arg-type]
        dsns = {}
        for role in ("owner", "worker", "producer"):
            params["user"] = f"fq_{role}"
            dsns[role] = make_conninfo(**params)  # type: ignore[arg-type]
        fairq.App(dsns["owner"]).migrate()
        assert main(["--dsn", dsns["owner"], "roles", "--apply", "--worker", "fq_worker",
                     "--worker-prune", "--producer", "fq_producer"]) == 0
        yield dsns


def test_each_role_has_what_tracing_needs(role_dsns: dict[str, str]) -> None:
    producer, worker = Traced(role_dsns["producer"]), Traced(role_dsns["worker"])
    try:
        with producer.tracer.start_as_current_span("request"):
            job_id = producer.app.enqueue("ok", tenant="a")  # through trace_jobs: no table grant
        [send] = producer.spans(SpanKind.PRODUCER)
        with psycopg.connect(role_dsns["producer"], autocommit=True) as conn:
            for statement in ("SELECT * FROM fairq.job_traces",
                              f"INSERT INTO fairq.job_traces VALUES ({job_id}, '{PARENT}')"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(statement)
        assert worker.app.store.job_trace(job_id) == TraceContext(parent_of(send))
        drain(worker.app)
        [process] = worker.spans(SpanKind.CONSUMER)
        assert process.parent is not None and process.parent.span_id == send.context.span_id
        with (psycopg.connect(role_dsns["worker"], autocommit=True) as conn,
              pytest.raises(psycopg.errors.InsufficientPrivilege)):
            conn.execute(f"UPDATE fairq.job_traces SET traceparent = '{PARENT}'")
        assert worker.app.store.prune_finished(0) == 1  # the pruning worker: job and context
        assert worker.rows() == {} and sweep_mark(role_dsns["owner"]) == "0"
    finally:
        producer.app.close()
        worker.app.close()


def test_a_claims_batch_reads_its_contexts_in_one_round_trip(
        traced: Traced, monkeypatch: pytest.MonkeyPatch) -> None:
    from fairq.job import Job
    from fairq.policies import get_policy

    reads: list[str] = []
    batch, one = fairq.otel.claim_traces, fairq.store.Store.job_trace
    monkeypatch.setattr(fairq.otel, "claim_traces",
                        lambda *a: reads.append("batch") or batch(*a))  # type: ignore[func-returns-value]
    monkeypatch.setattr(fairq.store.Store, "job_trace",
                        lambda self, i: reads.append("one") or one(self, i))  # type: ignore[func-returns-value]
    store = traced.app.store
    with traced.tracer.start_as_current_span("r"):
        ids = traced.app.enqueue_many("ok", [(f"t{i}", {}) for i in range(10)])
    untraced = store.enqueue([NewJob(task="ok", tenant="t0", payload_json="{}")])
    claimed = store.claim(get_policy("fifo"), queue="default", batch=20, worker="w")
    assert sorted(c.id for c in claimed) == sorted(ids + untraced)
    moved = next(c for c in claimed if c.id == ids[-1])  # a heartbeat moved its lease
    assert store.extend_leases([(moved.id, moved.attempts)], 600, started=[moved.started_at])
    [hook] = traced.app.attempt_hooks
    for c in claimed:
        with hook(Job.from_claim(c, store)):
            pass
    assert reads == ["batch", "one"]
    [send] = traced.spans(SpanKind.PRODUCER)
    parents = {int((s.attributes or {})["messaging.message.id"]): s.parent
               for s in traced.spans(SpanKind.CONSUMER)}
    assert all(parents[i] is not None and parents[i].span_id == send.context.span_id  # type: ignore[union-attr]
               for i in ids)
    assert parents[untraced[0]] is None


def test_a_context_that_cannot_be_read_never_fails_the_attempt(
        traced: Traced, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    with traced.tracer.start_as_current_span("r"):
        traced.app.enqueue_many("ok", [("a", {}), ("b", {})])

    def refused(*args: object) -> None:
        raise psycopg.errors.InsufficientPrivilege("permission denied for table job_traces")

    monkeypatch.setattr(fairq.otel, "claim_traces", refused)
    assert [o.status for o in drain(traced.app)] == ["done", "done"]
    assert [s.parent for s in traced.spans(SpanKind.CONSUMER)] == [None, None]
    [warning] = [r for r in caplog.records if r.name == "fairq.otel"]
    assert "permission denied for table job_traces" in warning.getMessage()


def test_a_worker_with_many_slots_gives_every_attempt_its_own_jobs_context(
        traced: Traced) -> None:
    """The batch reads under concurrency: 8 slots, batches of 16, two enqueues' jobs mixed."""
    app = traced.app
    app.tenants.set_defaults(max_running=1000)
    sent: dict[int, int] = {}
    for n in range(2):
        with traced.tracer.start_as_current_span(f"request {n}"):
            for job_id in app.enqueue_many("ok", [(f"t{i % 7}", {}) for i in range(150)]):
                sent[job_id] = n
    app.worker(concurrency=8, policy="weighted", batch=16).run(until_empty=True)
    sends = sorted(traced.spans(SpanKind.PRODUCER), key=lambda s: s.start_time or 0)
    processes = traced.spans(SpanKind.CONSUMER)
    assert len(processes) == 300
    for p in processes:
        expected = sends[sent[int((p.attributes or {})["messaging.message.id"])]]
        assert p.parent is not None and p.parent.span_id == expected.context.span_id
        assert p.context.trace_id == expected.context.trace_id
