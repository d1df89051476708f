"""``fairq demo``: the noisy neighbour, drained under FIFO and then under ``weighted``.

One tenant enqueues a big backlog first, then ten small tenants enqueue a few jobs each. Under
FIFO the small tenants wait behind the whole backlog; under a fair policy each gets a turn at
once. The demo runs both with a real in-process worker on a scratch schema (random name) and
drops it afterwards, so it is safe to run against any database. A client of the API like the
rest of the CLI, it lives with its command.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from fairq.app import App
from fairq.cli._common import EXIT_OK, check_connection
from fairq.job import Job
from fairq.store.ops import drop_schema

if TYPE_CHECKING:
    from fairq.cli._common import Subparsers

TASK = "fairq.demo.work"
BIG = "tenant-1"
POLICIES = ("fifo", "weighted")
BAR = 28


@dataclass(frozen=True)
class Shape:
    """How much work: the big tenant's backlog, the small tenants and their jobs."""

    big_jobs: int = 1000
    small_tenants: int = 10
    small_jobs: int = 5
    job_seconds: float = 0.01
    concurrency: int = 8

    def plan(self) -> list[tuple[str, int]]:
        """(tenant, jobs) in enqueue order: the big tenant first."""
        return [(BIG, self.big_jobs)] + [
            (f"tenant-{i}", self.small_jobs) for i in range(2, self.small_tenants + 2)]


QUICK = Shape(big_jobs=200, small_tenants=10, small_jobs=3, job_seconds=0.003)


@dataclass
class RunResult:
    """One policy's run: per-tenant waits (due to claimed, DB clock), drain time."""

    policy: str
    drain_s: float
    waits: dict[str, list[float]] = field(default_factory=dict)

    def small_waits(self) -> list[float]:
        return [w for t, ws in self.waits.items() if t != BIG for w in ws]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), -(-len(ordered) * q // 100)))
    return ordered[int(rank) - 1]


class Progress:
    """Per-tenant started/total counts, redrawn in place on a TTY, plain lines otherwise."""

    def __init__(self, out: IO[str], totals: dict[str, int], policy: str) -> None:
        self.out, self.totals, self.policy = out, totals, policy
        self.started = dict.fromkeys(totals, 0)
        self.tty = out.isatty()
        self._lines = 0
        self._lock = threading.Lock()
        self._last_plain = ""

    def hit(self, tenant: str) -> None:
        with self._lock:
            self.started[tenant] = self.started.get(tenant, 0) + 1

    def draw(self, elapsed: float, final: bool = False) -> None:
        with self._lock:
            started = dict(self.started)
        if self.tty:
            lines = [f"  {self.policy}: {elapsed:5.1f}s"]
            for tenant, total in self.totals.items():
                n = started[tenant]
                filled = round(BAR * n / total) if total else BAR
                lines.append(f"  {tenant:<10} [{'#' * filled}{'.' * (BAR - filled)}] {n:>5}/{total}")
            up = f"\x1b[{self._lines}F" if self._lines else ""
            self.out.write(up + "".join(f"\x1b[2K{line}\n" for line in lines))
            self._lines = len(lines)
        else:
            small_done = sum(1 for t, total in self.totals.items()
                             if t != BIG and started[t] >= total)
            line = (f"  {self.policy} {elapsed:5.1f}s: {BIG} {started[BIG]}/{self.totals[BIG]}, "
                    f"small tenants finished {small_done}/{len(self.totals) - 1}")
            if final or line.split(": ", 1)[1] != self._last_plain:
                self.out.write(line + "\n")
                self._last_plain = line.split(": ", 1)[1]
        self.out.flush()


def run_policy(dsn: str, policy: str, shape: Shape, out: IO[str],
               tick: float = 0.3, interval: float = 1.0) -> RunResult:
    """Enqueue the shape into a fresh scratch schema, drain it under ``policy``, drop the schema."""
    schema = f"fairq_demo_{secrets.token_hex(4)}"
    result = RunResult(policy, 0.0)
    lock = threading.Lock()
    plan = shape.plan()
    progress = Progress(out, dict(plan), policy)
    last_end = [0.0]
    total = sum(n for _, n in plan)
    all_done = threading.Event()
    app = App(dsn, schema=schema, pool_size=2)
    try:
        app.migrate()

        def work(job: Job) -> None:
            progress.hit(job.tenant)
            wait = (job.started_at - job.run_at).total_seconds()  # both on the DB clock
            time.sleep(shape.job_seconds)
            with lock:
                result.waits.setdefault(job.tenant, []).append(max(0.0, wait))
                last_end[0] = time.monotonic()
                if sum(map(len, result.waits.values())) >= total:
                    all_done.set()

        app.task(work, name=TASK)
        worker = app.worker(concurrency=shape.concurrency, policy=policy, poll_interval=0.5)
        failure: list[BaseException] = []

        def drain() -> None:
            try:
                worker.run()
            except BaseException as exc:  # reported by the caller's thread
                failure.append(exc)

        thread = threading.Thread(target=drain, name=f"fairq-demo-{policy}", daemon=True)
        thread.start()
        # The worker starts on an empty queue (connections, LISTEN) and the jobs come after, so
        # the waits measure scheduling alone, not how long this machine takes to start a worker.
        if not worker.ready.wait(30):
            worker.stop()
            raise RuntimeError(f"the {policy} worker did not start within 30 s")
        t0 = time.monotonic()
        # Due at the enqueue (run_at is its now()); its NOTIFY wakes the worker.
        app.enqueue_many(TASK, [(tenant, None) for tenant, n in plan for _ in range(n)])
        try:
            next_plain = t0
            while thread.is_alive():
                if all_done.wait(tick):
                    worker.stop()  # returns once the last finishes are written
                    thread.join()
                now = time.monotonic()
                if progress.tty or now >= next_plain:
                    progress.draw(now - t0)
                    next_plain = now + interval
        except KeyboardInterrupt:
            worker.stop()
            thread.join(10)
            raise
        progress.draw(time.monotonic() - t0, final=True)
        if failure:
            raise failure[0]
        result.drain_s = (last_end[0] or time.monotonic()) - t0
        return result
    finally:
        app.close()
        drop_schema(dsn, schema)


def summary_table(results: list[RunResult]) -> str:
    """The closing table: small tenants' p95 and max wait, and the drain time per policy."""
    header = ("policy", "small tenants p95 wait", "small tenants max wait", "total drain")
    rows = [(r.policy, f"{percentile(r.small_waits(), 95):.3f} s",
             f"{max(r.small_waits(), default=0.0):.3f} s", f"{r.drain_s:.2f} s") for r in results]
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(row, widths, strict=True)))
             for row in [header, *rows]]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def verdict(results: list[RunResult], shape: Shape) -> str:
    """One sentence on what the user just saw."""
    by = {r.policy: r for r in results}
    fifo, fair = by.get("fifo"), by.get("weighted")
    if fifo is None or fair is None:
        return ""
    f95, w95 = percentile(fifo.small_waits(), 95), percentile(fair.small_waits(), 95)
    ratio = f"{f95 / w95:.0f}x" if w95 > 0 else "far"
    return (f"Under FIFO the {shape.small_tenants} small tenants queued behind {BIG}'s "
            f"{shape.big_jobs} jobs (p95 wait {f95:.2f} s); under weighted fair scheduling each got "
            f"a turn at once (p95 {w95:.3f} s, {ratio} shorter), while the whole backlog drained "
            f"in about the same time ({fifo.drain_s:.1f} s vs {fair.drain_s:.1f} s).")


def run_demo(dsn: str, shape: Shape = Shape(), out: IO[str] | None = None,
        policies: tuple[str, ...] = POLICIES,
        on_result: Callable[[RunResult], Any] | None = None) -> list[RunResult]:
    """The whole demo: each policy in turn, then the table and the sentence."""
    stream = out or sys.stdout
    total = shape.big_jobs + shape.small_tenants * shape.small_jobs
    stream.write(f"fairq demo: {BIG} enqueues {shape.big_jobs} jobs, then tenants 2..."
                 f"{shape.small_tenants + 1} enqueue {shape.small_jobs} each ({total} jobs, "
                 f"{shape.job_seconds * 1000:g} ms each, {shape.concurrency} worker slots).\n")
    results = []
    for policy in policies:
        stream.write(f"\n{policy}:\n")
        r = run_policy(dsn, policy, shape, stream)
        results.append(r)
        if on_result is not None:
            on_result(r)
    stream.write("\n" + summary_table(results) + "\n\n" + verdict(results, shape) + "\n")
    stream.flush()
    return results


# -- the live workload `fairq web --demo` shows ------------------------------------------------
CONSOLE_SCHEMA = "fairq_demo"
LIVE_TASK = "fairq.demo.live"
NOISY, RATED, FAILING = "tenant-1", "tenant-2", "tenant-3"
SMALL = ("tenant-3", "tenant-4", "tenant-5", "tenant-6", "tenant-7")
CONSOLE_HINT = ("See it live in the operator console: fairq web --demo "
                "(pip install 'fairq[web]'), then open http://127.0.0.1:8080/")


class LiveDemo:
    """The noisy neighbour, kept running for the console in the schema ``fairq_demo``:
    ``tenant-1`` (weight 10) keeps a backlog and is held at its cap of 2, ``tenant-2`` (weight
    5) is rate limited to one job every 20 s, five small tenants (``tenant-3`` ...) keep a job
    or more queued and wait their turn for the one slot left, and one job of ``tenant-3`` failed
    (it succeeds when retried). A worker of 3 slots under ``weighted`` runs in this
    process until ``stop()``."""

    def __init__(self, dsn: str, schema: str = CONSOLE_SCHEMA, job_seconds: float = 1.0) -> None:
        self.app = App(dsn, schema=schema, pool_size=3)
        self.schema, self.job_seconds = schema, job_seconds
        self._stop = threading.Event()
        self._failed_once: set[int] = set()
        self._threads: list[threading.Thread] = []
        self.worker: Any = None

    def start(self) -> None:
        app = self.app
        app.migrate()
        app.tenants.set(NOISY, weight=10, max_running=2)
        app.tenants.set(RATED, weight=5, rate=0.05, burst=1)
        app.cancel_tenant(NOISY)  # a restart begins from a fresh backlog

        def work(job: Job) -> dict[str, Any]:
            if isinstance(job.payload, dict) and job.payload.get("fail") \
                    and job.id not in self._failed_once:
                self._failed_once.add(job.id)
                raise RuntimeError("report service answered 503 (demo: retry me, it passes then)")
            self._stop.wait(self.job_seconds)
            return {"ok": True}

        app.task(work, name=LIVE_TASK, max_attempts=1)
        if not app.jobs(tenant=FAILING, status="failed", limit=1):  # one (the key: once)
            app.enqueue(LIVE_TASK, tenant=FAILING, payload={"report": 42, "fail": True},
                        key="demo-failing")
        # No claim-ahead: each slot claims when it frees, so the console shows the turns as
        # the policy takes them.
        self.worker = app.worker(concurrency=3, policy="weighted", poll_interval=0.5,
                                 claim_ahead=0)
        run = threading.Thread(target=self.worker.run, name="fairq-demo-worker", daemon=True)
        feed = threading.Thread(target=self._produce, name="fairq-demo-producer", daemon=True)
        self._threads = [run, feed]
        run.start()
        feed.start()

    def _produce(self) -> None:
        """Keep the noisy tenant's backlog near 40 and each small tenant's at 3 or 4 (never
        empty: each keeps its place in the claim order), every second."""
        app, turn = self.app, 0
        while not self._stop.is_set():
            try:
                depth = app.queue_depth(tenant=NOISY)
                if depth.queued < 40:
                    app.enqueue_many(LIVE_TASK, [(NOISY, {"n": i}) for i in range(40)])
                for small in SMALL:  # more than the one slot left serves: they queue
                    if app.queue_depth(tenant=small).queued < 3:
                        app.enqueue_many(LIVE_TASK, [(small, {"turn": turn})] * 2)
                if app.queue_depth(tenant=RATED).queued < 5:
                    app.enqueue(LIVE_TASK, tenant=RATED, payload={"turn": turn})
            except Exception as exc:  # the database went away: say so once a round, go on
                print(f"fairq demo: producer: {exc}", file=sys.stderr)
            turn += 1
            self._stop.wait(1.0)

    def stop(self) -> None:
        self._stop.set()
        if self.worker is not None:
            self.worker.stop()
        for t in self._threads:
            t.join(30)
        self.app.close()


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "demo", parents=[common], help="the noisy neighbour under fifo, then weighted",
        description="Enqueue 1,000 jobs for one tenant, then 5 for each of ten others, and drain "
        "them with 8 worker slots under fifo and then weighted, showing per-tenant progress. "
        "Works in a scratch schema with a random name, dropped afterwards (--schema is ignored). "
        "With no --dsn or $FAIRQ_DATABASE_URL it uses the embedded PostgreSQL.",
    )
    p.add_argument("--quick", action="store_true", help="a smaller backlog (a few seconds)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from fairq.config import resolve_dsn

    dsn = resolve_dsn(getattr(args, "dsn", None))
    check_connection(dsn)
    run_demo(dsn, QUICK if args.quick else Shape())
    print("\n" + CONSOLE_HINT)
    return EXIT_OK
