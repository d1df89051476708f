"""Faults: the server restarts under running worker processes, connections (LISTEN's
included) are terminated, one session locks the jobs table, and handlers misbehave. After each,
every job ends exactly once in ``done`` (or in the state its own handler earned), no running slot
is leaked, and the workers are still alive.

Server faults run on a private throwaway cluster (tests/support/pgcluster.py), never the shared server.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import fairq
from tests.support.fault_tools import (
    check_final_state,
    executions,
    migrated_db,
    private_cluster,
    restart,
    spawn_worker,
    sql,
    stats,
    stop_worker,
    wait_for,
)


def done_count(dsn: str, ids: list[int]) -> int:
    return int(sql(dsn, "SELECT count(*) FROM fairq.jobs WHERE id = ANY(%s) AND status = 'done'",
                   (ids,))[0][0])


def start(w: Any) -> threading.Thread:
    th = threading.Thread(target=w.run, daemon=True)
    th.start()
    assert w.ready.wait(30), "worker did not start"
    return th


# -- PostgreSQL restarts ----------------------------------------------------------------------------
def test_postgres_restart_while_worker_processes_run(tmp_path: Path) -> None:
    """A fast shutdown and an immediate (crash) shutdown while two worker processes run."""
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    # synchronous_commit on: an immediate shutdown must not lose commits the workers saw, except
    # the workers' own finishes, which commit without waiting for the flush: a finish the crash
    # undoes leaves its job running under the default 300 s lease, longer than the deadline
    # below, unless the worker writes its recent finishes again after the lost connection.
    with private_cluster(tmp_path, synchronous_commit="on") as holder:
        dsn = migrated_db(holder[0])
        with fairq.App(dsn) as app:
            ids = app.enqueue_many("work", [(f"t{i % 12}", {"ms": 15}) for i in range(600)])
        workers = [spawn_worker(dsn, log_dir, "--concurrency", "4", "--poll", "0.5")
                   for _ in range(2)]
        outs: list[tuple[str, str]] = []
        try:
            wait_for(lambda: done_count(dsn, ids) >= 60, what="work to start")
            holder[0] = restart(holder[0], "fast")
            wait_for(lambda: done_count(dsn, ids) >= 300, timeout=120, what="work to resume")
            holder[0] = restart(holder[0], "immediate")
            wait_for(lambda: done_count(dsn, ids) == len(ids), timeout=180, what="all jobs done")
            assert all(w.poll() is None for w in workers), "a worker died"
        finally:
            outs = [stop_worker(w) for w in workers]
        check_final_state(dsn, ids)
        # Not asserted: that the workers met errors. Their pools drop connections the server
        # ended before handing them out (fairq/store/pool.py), so a worker between statements
        # may see none; what must hold is below.
        worker_stats = [stats(out) for out, _ in outs]
        assert sum(s["done"] for s in worker_stats) >= len(ids), worker_stats  # they did it all
        started, finished = executions(log_dir)
        assert set(finished) == set(ids)  # at least once
        attempts = dict(sql(dsn, "SELECT id, attempts FROM fairq.jobs WHERE id = ANY(%s)", (ids,)))
        # exactly-once claim: each execution had its own attempt, none ran twice in one attempt
        assert all(started[i] <= attempts[i] for i in ids), \
            [(i, started[i], attempts[i]) for i in ids if started[i] > attempts[i]]


# -- terminated connections, LISTEN included --------------------------------------------------------
def test_terminated_connections_relisten_and_poll_catches_missed_wakeups(tmp_path: Path) -> None:
    with private_cluster(tmp_path) as holder:
        dsn = migrated_db(holder[0])
        role = "fq_listen"
        sql(dsn, f"CREATE ROLE {role} LOGIN")
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        params = conninfo_to_dict(dsn)
        params["user"] = role
        listen_dsn = make_conninfo(**params)  # type: ignore[arg-type]
        app = fairq.App(dsn, listen_dsn=listen_dsn)
        ran: list[int] = []
        done = threading.Semaphore(0)

        @app.task(name="t")
        def t(job: fairq.Job) -> None:
            ran.append(job.id)
            done.release()

        w = app.worker(concurrency=2, poll_interval=1.0, max_backoff=1.0)
        th = start(w)
        listener = w._listener
        assert listener is not None
        try:
            # 1. Kill every session of the worker (pool and LISTEN) three times; work continues.
            for round_ in range(3):
                killed = sql(dsn, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                  "WHERE application_name LIKE %s", (w.application_name + "%",))
                assert killed[0][0] >= 1
                t.enqueue(tenant=f"a{round_}")
                assert done.acquire(timeout=60), "no progress after terminated connections"
            wait_for(lambda: listener.reconnects >= 1 and listener.connected.is_set(),
                     what="the listener to re-listen")
            # 2. The listener cannot come back: a job enqueued now notifies nobody, and only
            #    the fallback poll can find it.
            sql(dsn, f"ALTER ROLE {role} NOLOGIN")
            sql(dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (role,))
            wait_for(lambda: not listener.connected.is_set(), what="the listener to drop")
            missed = t.enqueue(tenant="missed")
            assert done.acquire(timeout=60), "the fallback poll did not catch the missed job"
            assert missed in ran
            assert not listener.connected.is_set(), "the listener was not down after all"
            # 3. The listener comes back and wake-ups work again: with a poll interval of an
            #    hour, only a NOTIFY can bring the next job in.
            sql(dsn, f"ALTER ROLE {role} LOGIN")
            wait_for(lambda: listener.connected.is_set(), what="the listener to re-listen")
            # Count the worker's polls (claim rounds over every queue): once the last 1 s poll
            # passed, the next is an hour away, and a poll that found the job fails the test.
            polls = [0]
            claim_round = w._claim_round

            def counting_round(store: Any, poll: bool) -> int:
                claimed = claim_round(store, poll)
                polls[0] += poll  # once the poll's claim is over
                return claimed

            w._claim_round = counting_round  # type: ignore[method-assign]
            w.poll_interval = 3600.0
            time.sleep(1.5)  # let the last 1 s poll pass, so the next one is an hour away
            seen = polls[0]
            woken = t.enqueue(tenant="woken")
            assert done.acquire(timeout=30), "no NOTIFY wake-up after the listener came back"
            assert woken in ran
            assert polls[0] == seen, "the job was found by a poll, not by its NOTIFY"
        finally:
            w.stop()
            th.join(30)
            app.close()  # the role goes with the private cluster
        assert not th.is_alive()
        assert w.stats.db_errors >= 1


# -- one session holds the jobs table ---------------------------------------------------------------
def test_lock_table_cannot_stall_workers_or_producers(dsn: str) -> None:
    """ACCESS EXCLUSIVE on the jobs table: claims, finishes and enqueues time out (lock_timeout)
    instead of waiting forever; the worker backs off and resumes when the lock is released."""
    app = fairq.App(dsn)

    @app.task(name="t")
    def t(job: fairq.Job) -> None:
        time.sleep(0.01)

    ids = app.enqueue_many("t", [(f"x{i % 5}", {}) for i in range(200)])
    w = app.worker(concurrency=4, poll_interval=0.5, max_backoff=1.0)
    th = start(w)
    wait_for(lambda: done_count(dsn, ids) >= 20, what="work to start")
    longest_wait = 0.0
    producer_error: list[BaseException] = []
    with psycopg.connect(dsn) as locker:
        locker.execute("LOCK TABLE fairq.jobs IN ACCESS EXCLUSIVE MODE")
        errors_before = w.stats.db_errors

        def produce() -> None:
            try:
                app.enqueue("t", tenant="late")
            except BaseException as e:
                producer_error.append(e)

        prod = threading.Thread(target=produce)
        prod.start()
        deadline = time.monotonic() + 14
        while time.monotonic() < deadline:
            row = sql(dsn, "SELECT coalesce(max(extract(epoch FROM now() - query_start)), 0) "
                           "FROM pg_stat_activity WHERE application_name LIKE 'fairq%%' "
                           "AND wait_event_type = 'Lock' AND datname = current_database()")
            longest_wait = max(longest_wait, float(row[0][0]))
            time.sleep(0.2)
        prod.join(30)
        errors_during = w.stats.db_errors - errors_before
        locker.rollback()
    # nobody waited on the lock much longer than lock_timeout (5 s), and it was long held (14 s)
    assert longest_wait < 9.0, longest_wait
    assert errors_during >= 1
    assert producer_error and isinstance(producer_error[0], psycopg.errors.LockNotAvailable), \
        producer_error
    wait_for(lambda: done_count(dsn, ids) == len(ids), timeout=120, what="work to resume")
    w.stop()
    th.join(30)
    app.close()
    assert not th.is_alive()
    check_final_state(dsn, ids)


# -- handlers that misbehave ------------------------------------------------------------------------
@pytest.fixture
def app(dsn: str) -> Iterator[fairq.App]:
    a = fairq.App(dsn)
    yield a
    a.close()


def test_handler_hanging_past_its_lease(app: fairq.App, dsn: str) -> None:
    """The heartbeat keeps a hung job's lease (it is running, and ours); other slots keep
    working; at stop, after the grace period, the job is handed back, not lost or left running."""
    release = threading.Event()

    @app.task(name="hang", lease=1)
    def hang(job: fairq.Job) -> None:
        release.wait(120)

    @app.task(name="quick", lease=30)
    def quick(job: fairq.Job) -> None:
        pass

    hung = hang.enqueue(tenant="h")
    quick_ids = app.enqueue_many("quick", [("q", {}) for _ in range(30)])
    w = app.worker(concurrency=2, poll_interval=0.2, reap_interval=0.2, grace_period=0.5)
    th = start(w)
    try:
        wait_for(lambda: done_count(dsn, quick_ids) == 30, what="the other slot to keep working")
        time.sleep(3.5)  # > 3 leases
        row = sql(dsn, "SELECT status, attempts, locked_until > now() FROM fairq.jobs "
                       "WHERE id = %s", (hung,))[0]
        assert row == ("running", 1, True), row  # never reaped while its worker lives
    finally:
        w.stop()
        th.join(30)
        release.set()
    assert not th.is_alive()
    info = app.job(hung)
    # The stop handed it back without spending the attempt it interrupted.
    assert info is not None and info.status == "queued" and info.attempts == 0, info
    assert "grace period" in (info.last_error or "")
    assert sql(dsn, "SELECT sum(fairq.tenant_running(ts)) FROM fairq.tenant_schedule ts")[0][0] == 0


class NastyError(Exception):
    """An exception whose message cannot even be rendered."""

    def __str__(self) -> str:
        raise RuntimeError("no message for you")


class Garbage:
    def __repr__(self) -> str:
        raise RuntimeError("unprintable")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("incomparable")

    __hash__ = None  # type: ignore[assignment]


async def _coro() -> int:
    return 1


RAISES: dict[str, BaseException] = {
    "keyboard_interrupt": KeyboardInterrupt(), "system_exit": SystemExit(3),
    "generator_exit": GeneratorExit(), "nasty_str": NastyError(),
    "recursion": RecursionError("deep"), "memory": MemoryError(),
}
RETURNS: dict[str, Any] = {
    "none": None, "int": 42, "garbage": Garbage(), "not_implemented": NotImplemented,
    "big": list(range(100_000)), "false": False, "exception_object": ValueError("returned"),
}


@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited")
def test_misbehaving_handlers_fail_or_finish_their_job_only(app: fairq.App, dsn: str) -> None:
    """BaseException subclasses (sync and async), unprintable errors and garbage return values:
    the worker survives, a raising handler's job is retried (or failed at max_attempts), and a
    returning handler's job is done, whatever it returned."""
    for label, exc in RAISES.items():
        def raiser(job: fairq.Job, exc: BaseException = exc) -> None:
            raise exc
        app.task(raiser, name=f"raise_{label}", max_attempts=1)

        async def araiser(job: fairq.Job, exc: BaseException = exc) -> None:
            await asyncio.sleep(0)
            raise exc
        app.task(araiser, name=f"araise_{label}", max_attempts=1)

    async def acancelled(job: fairq.Job) -> None:
        raise asyncio.CancelledError()
    app.task(acancelled, name="araise_cancelled", max_attempts=1)

    for label, value in RETURNS.items():
        def returner(job: fairq.Job, value: Any = value) -> Any:
            return value
        app.task(returner, name=f"return_{label}")

    def returns_coroutine(job: fairq.Job) -> Any:
        return _coro()  # a sync handler returning an un-awaited coroutine
    app.task(returns_coroutine, name="return_coroutine")

    ids = {name: app.enqueue(name, tenant=name) for name in app.tasks}
    ok = app.enqueue_many("return_none", [("after", {}) for _ in range(20)])
    w = app.worker(concurrency=3, poll_interval=0.2)
    th = start(w)
    wait_for(lambda: sql(dsn, "SELECT count(*) FROM fairq.jobs WHERE status IN ('queued', "
                              "'running')")[0][0] == 0, timeout=60, what="every job to settle")
    w.stop()
    th.join(30)
    assert not th.is_alive()
    for name, job_id in ids.items():
        info = app.job(job_id)
        assert info is not None
        if name.startswith(("raise_", "araise_")):
            assert info.status == "failed", (name, info)
            assert info.last_error, name
        else:
            assert info.status == "done", (name, info)
    assert done_count(dsn, ok) == 20  # and the worker kept working after all that
    assert sql(dsn, "SELECT sum(fairq.tenant_running(ts)) FROM fairq.tenant_schedule ts")[0][0] == 0


LEAKED: list[psycopg.Connection[Any]] = []


def test_handler_leaking_its_own_transaction(app: fairq.App, dsn: str) -> None:
    """A handler that opens its own transaction and never ends it. One that holds nothing of
    fairq's costs nothing; one that even locks its own job row blocks that job's finish (and, the
    finish being batched, this worker's other finishes) only until its session goes away: each
    try gives up at lock_timeout, the worker backs off and survives, and the job ends done."""
    sql(dsn, "CREATE TABLE app_rows (id int PRIMARY KEY, n int); INSERT INTO app_rows VALUES (1, 0)")

    @app.task(name="leak_app")
    def leak_app(job: fairq.Job) -> None:
        c = psycopg.connect(dsn)
        c.execute("UPDATE app_rows SET n = n + 1 WHERE id = 1 AND %s > 0", (job.id,))
        LEAKED.append(c)  # never committed, never closed

    @app.task(name="leak_own_row")
    def leak_own_row(job: fairq.Job) -> None:
        c = psycopg.connect(dsn)
        c.execute("SELECT 1 FROM fairq.jobs WHERE id = %s FOR UPDATE", (job.id,))
        LEAKED.append(c)
        # an idle_in_transaction_session_timeout (or the handler's GC) ends it eventually
        threading.Timer(8.0, c.close).start()

    @app.task(name="fine")
    def fine(job: fairq.Job) -> None:
        pass

    a = leak_app.enqueue(tenant="x")
    own = leak_own_row.enqueue(tenant="y")
    rest = app.enqueue_many("fine", [("z", {}) for _ in range(10)])
    w = app.worker(concurrency=2, poll_interval=0.2, max_backoff=1.0)
    th = start(w)
    try:
        wait_for(lambda: done_count(dsn, [a, own, *rest]) == 12, timeout=90,
                 what="all jobs, the self-locking one included, to finish")
        assert th.is_alive()
    finally:
        w.stop()
        th.join(30)
        for c in LEAKED:
            c.close()
        LEAKED.clear()
    assert w.stats.db_errors >= 1  # the finish did meet the lock, and gave up rather than wait
    check_final_state(dsn, [a, own, *rest])
    info = app.job(own)
    assert info is not None and info.attempts == 1
