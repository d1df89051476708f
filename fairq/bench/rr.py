"""The lab's round robin (``rr.sql``), run exactly as written on its own schema (``rr_schema.sql``).

Both files are verbatim copies of the design's lab statement and schema. One connection per slot,
because that statement claims and finishes one job per call; the measurements are the same
``RunData`` as fairq's runs.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql as pgsql

from fairq.bench.options import RR_POLICY
from fairq.bench.recording import (
    HERE,
    SQL,
    RunData,
    Tracker,
    db_epoch,
    drop_schema,
    producer,
    record_plan,
    sampler,
    wait_until_done,
)
from fairq.bench.scenarios import Scenario

RR_IDLE_S = 0.05  # a slot that found nothing sleeps this long (rr.sql has no notification)


def rr_statement() -> str:
    """The lab's round-robin statement, byte for byte as written in ``rr.sql``."""
    return (HERE / "rr.sql").read_text()


def _tenant_ids(sc: Scenario) -> dict[str, int]:
    names = sorted(sc.tenant_names())
    return {name: i + 1 for i, name in enumerate(names)}


def run_rr(dsn: str, sc: Scenario, deadline_s: float,
           progress: Callable[[int], None] | None = None) -> RunData:
    schema = f"rr_{secrets.token_hex(4)}"
    data = RunData(sc.name, RR_POLICY, expected=sc.total_jobs())
    tracker = Tracker(data)
    ids = _tenant_ids(sc)
    names = {v: k for k, v in ids.items()}
    sdsn = psycopg.conninfo.make_conninfo(dsn, options=f"-c search_path={schema}")
    statement = rr_statement()
    if sc.caps:
        data.notes.append("rr.sql has no caps: they are not enforced")
    if sc.weights:
        data.notes.append("rr.sql has no weights: every tenant gets one turn")
    if sc.fail_share:
        data.notes.append("rr.sql marks a job done as it claims it: failures are not retried")
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(pgsql.SQL("CREATE SCHEMA {}").format(pgsql.Identifier(schema)))
    try:
        with psycopg.connect(sdsn, autocommit=True) as conn:
            conn.execute((HERE / "rr_schema.sql").read_text())
            conn.execute(SQL["rr_insert_tenants"], {"tenants": list(ids.values())})
            for delay, _fail, tenants in sc.enqueue_groups():
                for start in range(0, len(tenants), 20_000):
                    chunk = tenants[start:start + 20_000]
                    conn.execute(SQL["rr_insert_jobs"], {"tenants": [ids[t] for t in chunk],
                                                         "delays": [delay] * len(chunk)})
            conn.execute("ANALYZE jobs; ANALYZE tenant_schedule")
            base = db_epoch(conn)
        data.due = [(t, base + d) for d, _, ts in sc.enqueue_groups() for t in ts]
        explain_sql = "EXPLAIN (ANALYZE, FORMAT JSON) " + statement.strip().rstrip(";")

        def explain(conn: psycopg.Connection[Any]) -> None:
            with conn.transaction(force_rollback=True):
                conn.execute(pgsql.SQL("SET LOCAL search_path = {}").format(
                    pgsql.Identifier(schema)))
                conn.execute("SET LOCAL statement_timeout = '2s'; SET LOCAL lock_timeout = '200ms'")
                record_plan(data, conn.execute(explain_sql).fetchone())

        stop = threading.Event()

        def slot() -> None:
            with psycopg.connect(sdsn, autocommit=True) as conn:
                while not stop.is_set():
                    t0 = time.perf_counter()
                    row = conn.execute(statement).fetchone()
                    data.claim_s.append(time.perf_counter() - t0)
                    if row is None:
                        data.empty_claims += 1
                        stop.wait(RR_IDLE_S)
                        continue
                    tenant = names[int(row[1])]
                    tracker.start(tenant, 0.0, 0.0)  # times are read back from the table
                    if sc.job_seconds:
                        time.sleep(sc.job_seconds)
                    tracker.end(tenant, True)

        stop_producer = threading.Event()
        producer_conn = psycopg.connect(sdsn, autocommit=True)

        def emit(batch: list[str]) -> None:
            producer_conn.execute(SQL["rr_insert_jobs"], {"tenants": [ids[t] for t in batch],
                                                          "delays": [0.0] * len(batch)})
            now = time.time()
            with tracker.lock:
                data.due.extend((t, now) for t in batch)

        try:
            with sampler(dsn, data, explain) as start_sampler:
                start_sampler()
                with psycopg.connect(dsn, autocommit=True) as conn:
                    data.released = db_epoch(conn)
                threads = [threading.Thread(target=slot, name=f"bench-rr-{i}", daemon=True)
                           for i in range(sc.workers * sc.slots)]
                feeder = threading.Thread(target=producer, args=(sc, emit, stop_producer),
                                            name="bench-producer", daemon=True)
                for t in threads:
                    t.start()
                feeder.start()
                data.timed_out = wait_until_done(tracker, deadline_s, progress)
                data.ended = time.time()
                stop_producer.set()
                feeder.join(10)
                stop.set()
                for t in threads:
                    t.join(30)
        finally:
            producer_conn.close()
        with psycopg.connect(sdsn, autocommit=True) as conn:
            rows = conn.execute(SQL["rr_served"], {"released": data.released}).fetchall()
        data.starts = [(names[int(r[0])], float(r[1]), float(r[2])) for r in rows]
        return data
    finally:
        drop_schema(dsn, schema)
