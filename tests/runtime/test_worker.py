"""The worker runtime against the real PostgreSQL: drain, failures, async, NOTIFY, shutdown."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import pytest

import fairq
from fairq.models import ClaimedJob
from fairq.observe import NullObserver
from fairq.runtime import Worker

SCHEMA = "fairq"
# The fair engine is tested in its own files; the lifecycle tests use the baseline claim.
POLICY = "fifo"


class Recorder(NullObserver):
    """Collects the worker's hook calls; ``wait_for`` blocks on an event, not on a timer."""

    def __init__(self) -> None:
        self.finishes: list[tuple[int, int, str]] = []
        self.claims: list[tuple[str, str, int]] = []
        self.reaps: list[tuple[str, int]] = []
        self.cond = threading.Condition()

    def on_claim(self, queue: str, policy: str, result: str, seconds: float,
                 jobs: Sequence[ClaimedJob]) -> None:
        with self.cond:
            self.claims.append((queue, result, len(jobs)))
            self.cond.notify_all()

    def on_finish(self, job: ClaimedJob, outcome: str, run_seconds: float) -> None:
        with self.cond:
            self.finishes.append((job.id, job.attempts, outcome))
            self.cond.notify_all()

    def on_reap(self, queue: str, expired: int, failed: int = 0) -> None:
        with self.cond:
            self.reaps.append((queue, expired))
            self.cond.notify_all()

    def wait_for(self, pred: Any, timeout: float = 30.0) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: pred(self), timeout), "timed out waiting"


@pytest.fixture
def app(dsn: str) -> Iterator[fairq.App]:
    a = fairq.App(dsn, schema=SCHEMA)
    yield a
    a.close()


def start(worker: Worker, until_empty: bool = False) -> threading.Thread:
    t = threading.Thread(target=worker.run, kwargs={"until_empty": until_empty}, daemon=True)
    t.start()
    assert worker.ready.wait(20)
    return t


def statuses(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as c:
        return dict(c.execute("SELECT status, count(*) FROM fairq.jobs GROUP BY 1").fetchall())


@pytest.mark.parametrize("policy", ["fifo", "weighted"])
def test_until_empty_drains_everything_once(app: fairq.App, dsn: str, policy: str) -> None:
    seen: list[int] = []
    lock = threading.Lock()

    @app.task(name="t")
    def t(job: fairq.Job) -> str:
        with lock:
            seen.append(job.id)
        return "ignored"

    ids = app.enqueue_many("t", [(f"tenant{i % 7}", {"i": i}) for i in range(300)])
    w = app.worker(policy=policy, concurrency=4, listen=False)
    w.run(until_empty=True)  # returns by itself
    assert sorted(seen) == sorted(ids)
    assert statuses(dsn) == {"done": 300}
    assert w.stats.done == 300
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT sum(fairq.tenant_running(ts)) "
                         "FROM fairq.tenant_schedule ts").fetchone() == (0,)


def test_until_empty_returns_with_nothing_runnable(app: fairq.App) -> None:
    @app.task(name="later")
    def later(job: fairq.Job) -> None:
        raise AssertionError("must not run")

    app.enqueue("later", tenant="a", delay=3600)
    w = app.worker(policy=POLICY, listen=False)
    w.run(until_empty=True)
    assert w.stats.claimed == 0


def test_failure_records_error_and_backoff(app: fairq.App, dsn: str) -> None:
    @app.task(name="boom", max_attempts=3)
    def boom(job: fairq.Job) -> None:
        raise ValueError(f"bad payload {job.payload['x']}")

    job_id = app.enqueue("boom", tenant="a", payload={"x": 42})
    w = app.worker(policy=POLICY, listen=False)
    w.run(until_empty=True)  # the retry is 20 s away: not runnable now
    info = app.job(job_id)
    assert info is not None
    assert info.status == "queued" and info.attempts == 1
    assert info.last_error is not None
    assert info.last_error.startswith("ValueError: bad payload 42")
    assert "in boom" in info.last_error  # a short traceback
    delay = (info.run_at - info.started_at).total_seconds() if info.started_at else 0
    assert 19 <= delay <= 21


def test_unknown_task_fails_job_not_worker(dsn: str) -> None:
    producer = fairq.App(dsn, schema=SCHEMA)  # registers nothing: any task name is accepted
    bad = producer.enqueue("x.missing", tenant="a", payload={})
    producer.close()
    app = fairq.App(dsn, schema=SCHEMA)

    @app.task(name="a.known")
    def known(job: fairq.Job) -> None:
        pass

    good = app.enqueue("a.known", tenant="a")
    w = app.worker(policy=POLICY, listen=False)
    w.run(until_empty=True)
    info = app.job(bad)
    assert info is not None and info.status == "queued" and info.attempts == 1
    assert info.last_error == "unknown task 'x.missing': this worker knows a.known"
    good_info = app.job(good)
    assert good_info is not None and good_info.status == "done"
    app.close()


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_base_exception_in_handler_fails_job_only(app: fairq.App, exc: type) -> None:
    @app.task(name="evil", max_attempts=1)
    def evil(job: fairq.Job) -> None:
        raise exc("from handler")

    @app.task(name="fine")
    def fine(job: fairq.Job) -> None:
        pass

    bad = app.enqueue("evil", tenant="a")
    ok = app.enqueue("fine", tenant="a")
    w = app.worker(policy=POLICY, concurrency=1, listen=False)
    w.run(until_empty=True)
    info = app.job(bad)
    assert info is not None and info.status == "failed"
    assert info.last_error is not None and info.last_error.startswith(exc.__name__)
    ok_info = app.job(ok)
    assert ok_info is not None and ok_info.status == "done"


def test_async_handler(app: fairq.App) -> None:
    import asyncio

    ran: list[tuple[int, int]] = []

    @app.task(name="coro")
    async def coro(job: fairq.Job) -> None:
        await asyncio.sleep(0.01)
        ran.append((job.id, threading.get_ident()))

    @app.task(name="coro_fail", max_attempts=1)
    async def coro_fail(job: fairq.Job) -> None:
        await asyncio.sleep(0)
        raise RuntimeError("async boom")

    ids = app.enqueue_many("coro", [("a", {}), ("b", {}), ("c", {})])
    bad = app.enqueue("coro_fail", tenant="a")
    w = app.worker(policy=POLICY, listen=False)
    w.run(until_empty=True)
    assert sorted(i for i, _ in ran) == sorted(ids)
    assert len({t for _, t in ran}) == 1  # one event loop thread
    info = app.job(bad)
    assert info is not None and info.status == "failed"
    assert info.last_error is not None and info.last_error.startswith("RuntimeError: async boom")


def test_job_fields_and_extend_lease(app: fairq.App, dsn: str) -> None:
    got: dict[str, Any] = {}

    @app.task(name="t", queue="q1", max_attempts=7, lease=60)
    def t(job: fairq.Job) -> None:
        got.update(id=job.id, tenant=job.tenant, payload=job.payload, attempt=job.attempt,
                   queue=job.queue, task=job.task, max_attempts=job.max_attempts)
        with psycopg.connect(dsn) as c:
            before = c.execute("SELECT locked_until FROM fairq.jobs WHERE id = %s",
                               (job.id,)).fetchone()
        job.extend_lease(3600)
        with psycopg.connect(dsn) as c:
            after = c.execute("SELECT locked_until FROM fairq.jobs WHERE id = %s",
                              (job.id,)).fetchone()
        got["extended"] = (after[0] - before[0]).total_seconds() if before and after else 0

    job_id = t.enqueue(tenant="acme", payload={"k": [1, 2]})
    app.worker(policy=POLICY, listen=False).run(until_empty=True)
    assert got["id"] == job_id and got["tenant"] == "acme" and got["payload"] == {"k": [1, 2]}
    assert got["attempt"] == 1 and got["queue"] == "q1" and got["task"] == "t"
    assert got["max_attempts"] == 7
    assert got["extended"] > 3000


def test_extend_lease_raises_lease_lost(app: fairq.App, dsn: str) -> None:
    outcome: dict[str, Any] = {}
    rec = Recorder()

    @app.task(name="t")
    def t(job: fairq.Job) -> None:
        with psycopg.connect(dsn, autocommit=True) as c:  # someone else's hand: lease gone
            c.execute("UPDATE fairq.jobs SET locked_until = now() - interval '1 s' "
                      "WHERE id = %s", (job.id,))
        s = fairq.store.Store(dsn, SCHEMA)
        try:
            s.reap_expired()
        finally:
            s.close()
        try:
            job.extend_lease()
        except fairq.LeaseLost as e:
            outcome["lost"] = str(e)
        outcome["flag"] = job.lease_lost

    job_id = t.enqueue(tenant="a")
    w = app.worker(policy=POLICY, listen=False, observer=rec)
    th = start(w)
    rec.wait_for(lambda r: r.finishes)
    w.stop()
    th.join(20)
    assert "no longer ours" in outcome["lost"] and outcome["flag"] is True
    # the job went back to the queue by the reaper; the worker's finish changed nothing,
    # or the worker re-claimed and ran it again (attempt 2): either way attempt 1 was lost.
    assert rec.finishes[0] == (job_id, 1, "lease_lost")


def test_notify_wakes_idle_worker(app: fairq.App) -> None:
    done = threading.Event()
    rec = Recorder()

    @app.task(name="t")
    def t(job: fairq.Job) -> None:
        done.set()

    w = app.worker(policy=POLICY, poll_interval=3600, observer=rec)  # the fallback poll never comes
    th = start(w)
    rec.wait_for(lambda r: len(r.claims) >= 1)  # the start-up poll happened
    polls_before = len(rec.claims)
    t.enqueue(tenant="a")
    assert done.wait(30), "the NOTIFY did not wake the worker"
    w.stop()
    th.join(20)
    assert len(rec.claims) > polls_before


def test_idle_worker_does_not_query_more_than_poll_interval(app: fairq.App) -> None:
    @app.task(name="t")
    def t(job: fairq.Job) -> None:
        pass

    # maintenance intervals far shorter than the window below; the poll interval far longer
    w = app.worker(policy=POLICY, poll_interval=3600, wake_interval=0.05, reap_interval=0.05,
                   stranded_interval=0.05)
    th = start(w)
    # ready is set at the end of the first loop (its poll and maintenance pass, LISTEN on):
    # from then on an idle worker waits for a NOTIFY or the poll an hour away.
    assert w.ready.wait(30)
    store = w.store
    real_cursor = store.cursor
    count = [0]

    def counting_cursor(**kwargs: Any) -> Any:
        count[0] += 1
        return real_cursor(**kwargs)

    store.cursor = counting_cursor  # type: ignore[method-assign]
    time.sleep(1.5)
    idle_count = count[0]
    t.enqueue(tenant="a")  # a notification is the other thing that may wake it
    deadline = time.monotonic() + 30
    while w.stats.done < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    w.stop()
    th.join(20)
    assert idle_count == 0, f"an idle worker ran {idle_count} transactions in 1.5 s"
    assert w.stats.done == 1 and count[0] > 0  # the counter does see the worker's queries


def test_no_idle_in_transaction_while_handler_runs(app: fairq.App, dsn: str) -> None:
    inside = threading.Event()
    release = threading.Event()

    @app.task(name="slow")
    def slow(job: fairq.Job) -> None:
        inside.set()
        release.wait(30)

    slow.enqueue(tenant="a")
    w = app.worker(policy=POLICY, listen=True)
    th = start(w)
    assert inside.wait(30)
    held: list[Any] = []
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("SELECT now()").fetchone()
        assert row is not None
        handler_running_since = row[0]
        names = set()
        # A short transaction is briefly "idle in transaction" between its round trips (the
        # worker's maintenance runs while it is busy); a transaction held across the handler
        # began before the handler did and is still open on every look.
        for _ in range(10):
            time.sleep(0.1)
            rows = c.execute(
                "SELECT application_name, state, xact_start FROM pg_stat_activity "
                "WHERE application_name LIKE %s", (w.application_name + "%",)).fetchall()
            names |= {r[0] for r in rows}
            held += [r for r in rows if r[1].startswith("idle in transaction")
                     and r[2] is not None and r[2] < handler_running_since]
    release.set()
    w.stop()
    th.join(20)
    assert names, "the worker's sessions must be visible under its application_name"
    assert held == [], held


def test_slow_worker_finish_changes_nothing(app: fairq.App, dsn: str, store: Any) -> None:
    """the lease expires, the reaper requeues, another worker re-claims; the slow
    worker's finish then touches no row and is reported as lease_lost."""
    inside = threading.Event()
    release = threading.Event()
    rec = Recorder()

    @app.task(name="slow", lease=60)
    def slow(job: fairq.Job) -> None:
        inside.set()
        release.wait(30)

    job_id = slow.enqueue(tenant="a")
    w = app.worker(policy=POLICY, listen=False, observer=rec, poll_interval=3600,
                   heartbeat_interval=3600)
    th = start(w)
    assert inside.wait(30)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("UPDATE fairq.jobs SET locked_until = now() - interval '1 s' WHERE id = %s",
                  (job_id,))
    assert store.reap_expired().requeued == {"default": 1}
    other = store.claim(fairq.policies.get_policy("fifo"), queue="default", batch=1,
                        worker="other")
    assert [(j.id, j.attempts) for j in other] == [(job_id, 2)]
    release.set()
    rec.wait_for(lambda r: r.finishes)
    assert rec.finishes == [(job_id, 1, "lease_lost")]
    info = app.job(job_id)
    assert info is not None and info.status == "running" and info.attempts == 2
    assert info.locked_by == "other"
    assert [f.id for f in store.finish_done([(job_id, 2)])] == [job_id]
    w.stop()
    th.join(20)
    assert w.stats.lease_lost == 1 and w.stats.done == 0


def test_heartbeat_keeps_long_job_alive(app: fairq.App, dsn: str, store: Any) -> None:
    ran = threading.Event()
    release = threading.Event()

    # A 2 s lease renewed every 0.2 s: ten heartbeats of margin on a loaded machine.
    @app.task(name="long", lease=2)
    def long(job: fairq.Job) -> None:
        ran.set()
        release.wait(30)

    job_id = long.enqueue(tenant="a")
    w = app.worker(policy=POLICY, listen=False, heartbeat_interval=0.2)
    th = start(w)
    assert ran.wait(30)
    # wait until several leases' worth of time has passed, checking the reaper finds nothing
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        assert store.reap_expired().total == 0
        time.sleep(0.2)
    release.set()
    w.stop()
    th.join(20)
    info = app.job(job_id)
    assert info is not None and info.status == "done" and info.attempts == 1


def test_stop_lets_inflight_finish(app: fairq.App) -> None:
    inside = threading.Event()
    release = threading.Event()

    @app.task(name="t")
    def t(job: fairq.Job) -> None:
        inside.set()
        release.wait(30)

    job_id = t.enqueue(tenant="a")
    waiting = t.enqueue(tenant="a", delay=3600)
    w = app.worker(policy=POLICY, listen=False, grace_period=30)
    th = start(w)
    assert inside.wait(30)
    w.stop()
    time.sleep(0.2)
    assert th.is_alive()  # still waiting for the in-flight job
    release.set()
    th.join(20)
    assert not th.is_alive()
    info = app.job(job_id)
    assert info is not None and info.status == "done"
    w_info = app.job(waiting)
    assert w_info is not None and w_info.status == "queued" and w_info.attempts == 0


def test_grace_period_exceeded_hands_job_back(app: fairq.App) -> None:
    inside = threading.Event()
    release = threading.Event()

    @app.task(name="stuck")
    def stuck(job: fairq.Job) -> None:
        inside.set()
        release.wait(30)

    job_id = stuck.enqueue(tenant="a")
    w = app.worker(policy=POLICY, listen=False, grace_period=0.3)
    th = start(w)
    assert inside.wait(30)
    w.stop()
    th.join(20)
    assert not th.is_alive()
    info = app.job(job_id)
    # Handed back without spending the attempt the stop interrupted.
    assert info is not None and info.status == "queued" and info.attempts == 0
    assert info.last_error is not None and "grace period" in info.last_error
    assert w.stats.abandoned == 1
    release.set()


def test_release_unstarted_is_fenced(store: Any, app: fairq.App, dsn: str) -> None:
    ids = app.enqueue_many("t", [("a", {}), ("a", {})])
    claimed = store.claim(fairq.policies.get_policy("fifo"), queue="default", batch=2, worker="w")
    assert sorted(j.id for j in claimed) == sorted(ids)
    first, second = sorted(claimed, key=lambda j: j.id)
    assert store.release_unstarted([(first.id, first.attempts), (second.id, 99)]) == {first.id}
    info = app.job(first.id)
    assert info is not None and info.status == "queued" and info.attempts == 0
    with psycopg.connect(dsn) as c:
        row = c.execute("SELECT fairq.tenant_running(ts), active FROM fairq.tenant_schedule ts "
                        "WHERE tenant = 'a'").fetchone()
    assert row == (1, True)
    again = store.claim(fairq.policies.get_policy("fifo"), queue="default", batch=2, worker="w")
    assert [(j.id, j.attempts) for j in again] == [(first.id, 1)]


def test_worker_survives_terminated_connections(app: fairq.App, dsn: str) -> None:
    done = threading.Semaphore(0)

    @app.task(name="t")
    def t(job: fairq.Job) -> None:
        done.release()

    w = app.worker(policy=POLICY, poll_interval=0.2)
    th = start(w)
    t.enqueue(tenant="a")
    assert done.acquire(timeout=30)
    with psycopg.connect(dsn, autocommit=True) as c:
        n = c.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                      "WHERE application_name LIKE %s", (w.application_name + "%",)).fetchone()
    assert n is not None and n[0] >= 1
    t.enqueue(tenant="a")
    assert done.acquire(timeout=60), "the worker did not recover from lost connections"
    w.stop()
    th.join(20)
    assert th is not None and not th.is_alive()


def test_listener_relistens_after_reconnect(app: fairq.App, dsn: str) -> None:
    done = threading.Semaphore(0)

    @app.task(name="t")
    def t(job: fairq.Job) -> None:
        done.release()

    w = app.worker(policy=POLICY, poll_interval=3600)  # only NOTIFY can bring the job in time
    th = start(w)
    listener = w._listener
    assert listener is not None
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                  "WHERE application_name = %s", (listener.application_name,))
    deadline = time.monotonic() + 60
    while not (listener.reconnects >= 1 and listener.connected.is_set()):
        assert time.monotonic() < deadline, "the listener did not reconnect"
        time.sleep(0.05)
    t.enqueue(tenant="a")
    assert done.acquire(timeout=60), "no wake-up after the listener reconnected"
    w.stop()
    th.join(20)


def test_a_stuck_finish_does_not_stop_claiming_or_other_finishes(
        app: fairq.App, dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    """Finishes are written by their own thread: while tenant a's failure waits on a lock held
    elsewhere, the claimer keeps running tenant b's jobs, and once a's statement gave up
    (lock_timeout) b's finishes go through without it; a's failure is written once the lock
    goes."""
    ran: list[str] = []
    lock = threading.Lock()
    inside, release = threading.Event(), threading.Event()

    @app.task(name="t")
    def t(job: fairq.Job) -> None:
        try:
            if job.tenant == "a":
                inside.set()
                release.wait(30)
                raise RuntimeError("a fails, to be retried")
        finally:
            with lock:
                ran.append(job.tenant)

    rec = Recorder()
    app.enqueue("t", tenant="a")
    w = app.worker(concurrency=2, policy=POLICY, poll_interval=0.2, observer=rec)
    th = start(w)
    with psycopg.connect(dsn) as blocker:
        try:
            assert inside.wait(30)
            # a's failure is retried, so its tenant wakes for the retry: the finish waits for
            # a's schedule row (slots.sql), which this transaction holds as a claim would.
            blocker.execute("SELECT 1 FROM fairq.tenant_schedule WHERE tenant = 'a' "
                            "FOR NO KEY UPDATE")
            release.set()
            rec.wait_for(lambda r: ran.count("a") == 1)
            lease = "SELECT locked_until FROM fairq.jobs WHERE tenant = 'a'"
            with psycopg.connect(dsn, autocommit=True) as c:
                before = c.execute(lease).fetchone()
            app.enqueue_many("t", [("b", {}) for _ in range(5)])
            rec.wait_for(lambda r: ran.count("b") == 5)  # claimed and run meanwhile
            # b's finishes do not wait for a's row: a is finished on its own from now on.
            rec.wait_for(lambda r: sum(1 for f in r.finishes if f[2] == "done") == 5)
            assert statuses(dsn) == {"done": 5, "running": 1}  # a's still waits for the lock
            assert "finishes of tenant 'a' (queue 'default') wait" in caplog.text
            with psycopg.connect(dsn, autocommit=True) as c:  # its handler returned: no more
                after = c.execute(lease).fetchone()             # heartbeats, but the finisher's
            assert before is not None and after is not None and after[0] > before[0]
            blocker.rollback()
            rec.wait_for(lambda r: sum(1 for f in r.finishes if f[2] == "retry") == 1)
        finally:
            release.set()
            blocker.rollback()
            w.stop()
            th.join(30)
    assert statuses(dsn) == {"done": 5, "queued": 1}


@pytest.mark.parametrize("pooler", [False, True])
def test_finishes_skip_the_wal_flush_unless_durable(dsn: str, pooler: bool) -> None:
    """The finisher's sessions commit without waiting for the WAL flush (a crash can only undo
    a finish, which re-runs the job); the claiming sessions, and durable_finishes, keep the
    server's own setting, whatever it is."""
    with psycopg.connect(dsn, autocommit=True) as c:
        server = c.execute("SHOW synchronous_commit").fetchone()[0]  # type: ignore[index]
    for durable, want in ((False, "off"), (True, server)):
        app = fairq.App(dsn, schema=SCHEMA, pooler=pooler)
        w = app.worker(policy=POLICY, durable_finishes=durable)
        try:
            for store, expected in ((w.finish_store, want), (w.store, server)):
                with store.cursor() as cur:
                    cur.execute("SHOW synchronous_commit")
                    assert cur.fetchone() == {"synchronous_commit": expected}
        finally:
            w.finish_store.close()
            w.store.close()
            app.close()


def test_only_a_lost_connection_replays_recent_finishes(app: fairq.App) -> None:
    """Finishes are written again after the connection or the server went away (a crash may
    have undone them), not after a lock or statement timeout, which leave the server up."""
    from psycopg import errors
    from psycopg_pool import PoolTimeout

    lost = [psycopg.OperationalError("server closed the connection unexpectedly"),
            errors.AdminShutdown("terminating connection"), errors.CrashShutdown("crash"),
            errors.ConnectionFailure("gone"), PoolTimeout("no connection in 5 s")]
    kept = [errors.LockNotAvailable("lock timeout"), errors.QueryCanceled("statement timeout"),
            errors.UniqueViolation("a bug"), errors.DeadlockDetected("deadlock")]
    for durable in (False, True):
        w = app.worker(policy=POLICY, durable_finishes=durable)
        for e in lost + kept:
            w.finisher.replay_wanted.clear()
            w.finisher.lost_connection(e)
            assert w.finisher.replay_wanted.is_set() == (not durable and e in lost), e
