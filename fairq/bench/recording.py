"""What every bench run records, and the plumbing the runners share.

``RunData`` holds one run's raw observations; ``metrics.summarise`` turns them into figures. A
side thread (``sampler``) samples lock waits from ``pg_stat_activity``/``pg_locks`` and, about once
a second, the claim statement's planning and execution time with ``EXPLAIN ANALYZE`` in a
rolled-back transaction. The statements are named blocks of ``bench.sql``.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql as pgsql

from fairq.bench.scenarios import Scenario

HERE = Path(__file__).resolve().parent
SAMPLE_EVERY_S = 0.05
EXPLAIN_EVERY_S = 1.0


def _statements() -> dict[str, str]:
    text = (HERE / "bench.sql").read_text()
    out: dict[str, str] = {}
    for block in re.split(r"^-- name: ", text, flags=re.MULTILINE)[1:]:
        name, _, body = block.partition("\n")
        out[name.strip()] = "\n".join(
            line for line in body.splitlines() if not line.startswith("--")).strip()
    return out


SQL = _statements()

@dataclass
class RunData:
    """Raw observations of one run; ``metrics.summarise`` turns them into figures."""

    scenario: str
    policy: str
    expected: int
    released: float = 0.0  # DB epoch when workers were let go
    ended: float = 0.0
    completed: int = 0
    starts: list[tuple[str, float, float]] = field(default_factory=list)  # tenant, epoch, wait
    due: list[tuple[str, float]] = field(default_factory=list)  # tenant, epoch a job became due
    claim_s: list[float] = field(default_factory=list)
    empty_claims: int = 0
    plan_ms: list[float] = field(default_factory=list)
    exec_ms: list[float] = field(default_factory=list)
    lock_samples: list[tuple[int, int, int]] = field(default_factory=list)
    max_running: dict[str, int] = field(default_factory=dict)
    timed_out: bool = False
    notes: list[str] = field(default_factory=list)


class Tracker:
    """Thread-safe counters the handlers update: starts, completions, concurrency per tenant."""

    def __init__(self, data: RunData) -> None:
        self.data = data
        self.lock = threading.Lock()
        self.running: dict[str, int] = {}
        self.all_done = threading.Event()

    def start(self, tenant: str, epoch: float, wait: float) -> None:
        with self.lock:
            self.data.starts.append((tenant, epoch, max(0.0, wait)))
            n = self.running.get(tenant, 0) + 1
            self.running[tenant] = n
            if n > self.data.max_running.get(tenant, 0):
                self.data.max_running[tenant] = n

    def end(self, tenant: str, ok: bool) -> None:
        with self.lock:
            self.running[tenant] -= 1
            if ok:
                self.data.completed += 1
                if self.data.completed >= self.data.expected:
                    self.all_done.set()


def db_epoch(conn: psycopg.Connection[Any]) -> float:
    row = conn.execute(SQL["db_epoch"]).fetchone()
    assert row is not None
    return float(row[0])


@contextmanager
def sampler(dsn: str, data: RunData, explain: Callable[[psycopg.Connection[Any]], None]
             ) -> Iterator[Callable[[], None]]:
    """Side thread: lock samples every 50 ms, one EXPLAIN ANALYZE sample a second."""
    stop = threading.Event()
    conn = psycopg.connect(dsn, autocommit=True)

    def sample_now() -> None:
        try:
            explain(conn)
        except psycopg.Error as exc:  # a timed-out sample is skipped, not fatal
            data.notes.append(f"explain sample skipped: {type(exc).__name__}")

    def sample_locks() -> None:
        row = conn.execute(SQL["lock_sample"]).fetchone()
        if row is not None:
            data.lock_samples.append((int(row[0]), int(row[1]), int(row[2])))

    def loop() -> None:
        next_explain = time.monotonic() + EXPLAIN_EVERY_S
        while not stop.wait(SAMPLE_EVERY_S):
            sample_locks()
            if time.monotonic() >= next_explain:
                sample_now()
                next_explain = time.monotonic() + EXPLAIN_EVERY_S

    thread = threading.Thread(target=loop, name="bench-sampler", daemon=True)

    def start() -> None:
        sample_now()  # one sample before release, while the whole backlog is queued
        sample_locks()  # and one lock sample, so a run shorter than the interval still has one
        thread.start()

    try:
        yield start
    finally:
        stop.set()
        if thread.ident is not None:
            thread.join(5)
        conn.close()


def record_plan(data: RunData, row: tuple[Any, ...] | None) -> None:
    if not row:
        return
    plan = row[0][0] if isinstance(row[0], list) else row[0]
    data.plan_ms.append(float(plan["Planning Time"]))
    data.exec_ms.append(float(plan["Execution Time"]))


def wait_until_done(tracker: Tracker, deadline_s: float,
                     progress: Callable[[int], None] | None) -> bool:
    """Block until every expected job succeeded or the deadline; True if it timed out."""
    end = time.monotonic() + deadline_s
    while not tracker.all_done.wait(0.25):
        if progress is not None:
            progress(tracker.data.completed)
        if time.monotonic() >= end:
            return True
    if progress is not None:
        progress(tracker.data.completed)
    return False


def producer(sc: Scenario, emit: Callable[[list[str]], None], stop: threading.Event) -> None:
    """Steady arrivals: ``rate`` jobs a second in ticks of 50 ms, tenants in turn."""
    if sc.arrivals is None:
        return
    tick = 0.05
    n_ticks = round(sc.arrivals.seconds / tick)
    per_tick = sc.arrivals.per_tick(tick)
    tenants = sc.arrivals.tenants
    k = 0
    t0 = time.monotonic()
    for i in range(n_ticks):
        if stop.is_set():
            return
        batch = [tenants[(k + j) % len(tenants)] for j in range(per_tick)]
        k += per_tick
        emit(batch)
        delay = t0 + (i + 1) * tick - time.monotonic()
        if delay > 0:
            stop.wait(delay)


def drop_schema(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(pgsql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(pgsql.Identifier(schema)))
