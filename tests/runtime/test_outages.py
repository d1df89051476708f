"""Outages under load: the server restarted (fast, immediate), PgBouncer restarted, the server
refusing connections for 30 s, each while a producer enqueues and two ``fairq worker``
processes (4 slots each) drain a backlog on a private cluster. After each: every enqueue the
producer saw succeed is in the database and done, every job is done with no running slot
leaked, no job ran twice at the same time (the workers' execution spans), each worker logged
the outage in a few lines (one "lost", one "back" with the time it took) and counted one
reconnect. The figures are printed (docs/reliability.md, "Outages").

The exporter, scraped through the fast restart, reconnects and counts it. Also: a claim whose
answer is lost with its connection is resolved by reading back what the worker holds (not by
waiting for its lease), the pools reconnect at a capped pace, and a lease renewed after it
expired but before it was reaped stays its worker's.

The immediate restart and the 30 s outage run with ``FAIRQ_SLOW=1`` (docs/reliability.md).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

import fairq
from fairq.metrics.exporter import DatabaseCollector
from fairq.policies import get_policy
from fairq.runtime.db_errors import PoolNoise, quiet_pool_logs
from fairq.runtime.outage import Outage
from fairq.store.pool import POOL_RECONNECT_CAP, Pool, reconnect_delay
from tests.support import pgcluster
from tests.support.fault_tools import (
    Bouncer,
    Producer,
    check_final_state,
    hold_down,
    migrated_db,
    outage_log,
    overlaps,
    private_cluster,
    restart,
    spans,
    spawn_worker,
    sql,
    stats,
    stop_worker,
    wait_for,
)

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
slow = pytest.mark.skipif(not os.environ.get("FAIRQ_SLOW"), reason="slow: set FAIRQ_SLOW=1")
JOBS = 400
LINES_PER_OUTAGE = 6  # lost, back, and at most a few of: finishes written again, a hand-back


def count(dsn: str, where: str, params: Any = None) -> int:
    return int(sql(dsn, f"SELECT count(*) FROM fairq.jobs WHERE {where}", params)[0][0])


def register_tasks(app: fairq.App) -> None:
    """fault_worker's tasks with their leases (5 s and 3 s), so that enqueues get them."""
    app.task(lambda job: None, name="work", lease=5, max_attempts=20)
    app.task(lambda job: None, name="hold", lease=3, max_attempts=20)


def under_load(tmp_path: Path, dsn: str, fault: Callable[[], float], *, worker_dsn: str | None = None,
               worker_args: tuple[str, ...] = (), producer_options: dict[str, Any] | None = None,
               hold: float = 0.0, seen: bool = True) -> dict[str, Any]:
    """Run ``fault`` (returns the wall time the database answered again) while a producer
    enqueues and two workers drain ``JOBS`` jobs (and, with ``hold``, a few jobs running that
    many seconds across the fault); check everything this module's docstring says; return the
    figures. ``seen=False``: the workers need not have met the fault (a pooler's restart is
    over before a worker that was between statements notices it)."""
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    with fairq.App(dsn) as app:
        register_tasks(app)
        ids = app.enqueue_many("work", [(f"t{i % 12}", {"ms": 20}) for i in range(JOBS)])
        if hold:
            ids += app.enqueue_many("hold", [(f"h{i}", {"s": hold}) for i in range(2)])
    target = worker_dsn or dsn
    workers = [spawn_worker(target, log_dir, "--concurrency", "4", "--poll", "0.5", *worker_args)
               for _ in range(2)]
    producer = Producer(worker_dsn or dsn, **(producer_options or {}))
    register_tasks(producer.app)
    producer.start()
    outs: list[tuple[str, str]] = []
    try:
        wait_for(lambda: count(dsn, "status = 'done'") >= 100, what="work to start")
        if hold:
            wait_for(lambda: count(dsn, "task = 'hold' AND status = 'running'") == 2,
                     what="the long jobs to run")
        down_at = time.time()
        back_at = fault()
        wait_for(lambda: producer.first_ok_after(back_at) is not None, timeout=60,
                 what="an enqueue after the outage")
        time.sleep(0.5)
        produced = producer.stop()
        wait_for(lambda: count(dsn, "status <> 'done'") == 0, timeout=120, what="every job done")
        assert all(w.poll() is None for w in workers), "a worker died"
    finally:
        producer.stop()
        outs = [stop_worker(w) for w in workers]
    all_ids = [int(r[0]) for r in sql(dsn, "SELECT id FROM fairq.jobs")]
    check_final_state(dsn, all_ids)
    assert set(ids) | set(produced) <= set(all_ids), "an enqueue the producer saw succeed is lost"
    runs = spans(log_dir)
    assert set(runs) == set(all_ids)
    assert overlaps(runs) == [], "a job ran twice at the same time"
    last_done = float(sql(dsn, "SELECT extract(epoch FROM max(finished_at)) FROM fairq.jobs "
                               "WHERE task = 'work' AND created_at < to_timestamp(%s)",
                               (back_at,))[0][0])
    first_start = min(s for r in runs.values() for s, _ in r if s >= back_at)
    per_worker = [outage_log(err) for _, err in outs]
    figures = {
        "down_s": round(back_at - down_at, 1),
        "first_start_after_back_s": round(first_start - back_at, 2),
        "last_old_job_done_after_back_s": round(last_done - back_at, 2),
        "enqueue_back_after_s": round(producer.first_ok_after(back_at) or -1, 2),
        "enqueues_ok": len(produced), "enqueues_failed": len(producer.unknown),
        "log_lines_per_worker": [n for n, _, _ in per_worker],
        "back_lines_say_s": [b for _, _, b in per_worker],
        "reconnects": [stats(out)["reconnects"] for out, _ in outs],
        "handed_back": [stats(out)["released"] for out, _ in outs],
        "reruns": sum(len(r) - 1 for r in runs.values()),
    }
    print(f"\n{figures}")
    # A worker whose every statement ran on a live session saw no outage (an idle one drops its
    # dead connections before using them); one that did logs it in a few lines, and counts it.
    if seen:
        assert sum(lost for _, lost, _ in per_worker) >= 1, "no worker saw the outage"
    for (out, err), (lines, lost, back) in zip(outs, per_worker, strict=True):
        assert "error connecting in" not in err, "psycopg_pool's per-attempt lines leaked"
        assert lost <= 2 and len(back) == lost, err[-3000:]
        assert lines <= LINES_PER_OUTAGE * max(lost, 1), err[-3000:]
        assert stats(out)["reconnects"] == lost
    return figures


# -- CI ----------------------------------------------------------------------------------------
@pytest.mark.timeout(240)
def test_fast_restart_under_load(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """And the exporter, scraped every 0.2 s through it: one line lost, one back, one
    reconnect counted, up again."""
    with private_cluster(tmp_path, synchronous_commit="on") as holder:
        dsn = migrated_db(holder[0])
        collector = DatabaseCollector(dsn, "fairq", interval=0.1, scrape_wait=5.0)
        scraped: list[tuple[float, float, float]] = []  # (time, up, reconnects)
        done = threading.Event()

        def scrape() -> None:
            while not done.wait(0.2):
                got = {s.name: s.value for fam in collector.collect() for s in fam.samples}
                scraped.append((time.time(), got["fairq_exporter_up"],
                                got["fairq_db_reconnects_total"]))

        def fault() -> float:
            holder[0] = restart(holder[0], "fast")
            return time.time()

        scraper = threading.Thread(target=scrape, daemon=True)
        try:
            with caplog.at_level(logging.WARNING, logger="fairq.exporter"):
                scraper.start()
                under_load(tmp_path, dsn, fault)
                wait_for(lambda: bool(scraped) and scraped[-1][1:] == (1.0, 1.0),
                         what="the exporter up again, one reconnect counted")
        finally:
            done.set()
            scraper.join(30)
            collector.close()
    assert any(up == 0.0 for _, up, _ in scraped) or caplog.records, "the exporter saw nothing"
    lines = [r.getMessage() for r in caplog.records if r.name == "fairq.exporter"]
    assert [("lost" in ln, "back after" in ln) for ln in lines] == [(True, False), (False, True)], \
        lines


@pytest.mark.timeout(240)
@pytest.mark.skipif(not os.path.exists(PGBOUNCER), reason="pgbouncer not installed")
def test_pgbouncer_restart_under_load(tmp_path: Path) -> None:
    with private_cluster(tmp_path, synchronous_commit="on") as holder:
        dsn = migrated_db(holder[0])
        bouncer = Bouncer(dsn, PGBOUNCER)
        try:
            bouncer.start()

            def fault() -> float:
                bouncer.restart()
                return time.time()

            under_load(tmp_path, dsn, fault, worker_dsn=bouncer.dsn,
                       worker_args=("--pooler", "--prepare-threshold", "none",
                                    "--listen-dsn", dsn),
                       producer_options={"pooler": True, "prepare_threshold": None,
                                         "listen_dsn": dsn}, seen=False)
        finally:
            bouncer.remove()


def test_a_claim_whose_answer_is_lost_is_read_back(dsn: str, caplog: pytest.LogCaptureFixture
                                                   ) -> None:
    """The claim commits, then its connection is lost before the answer arrives: the worker
    does not know it holds those jobs. With a 300 s lease, waiting for the reaper would take
    five minutes; reading back what it holds hands them back at once, and they run."""
    app = fairq.App(dsn)
    ran: list[tuple[int, int]] = []

    @app.task(name="t", lease=300)
    def t(job: fairq.Job) -> None:
        ran.append((job.id, job.attempt))

    ids = app.enqueue_many("t", [(f"c{i % 3}", {}) for i in range(20)])
    w = app.worker(concurrency=2, poll_interval=0.2)
    real = w.store.claim
    lost: list[int] = []

    def lossy(policy: Any, **kw: Any) -> Any:
        jobs = real(policy, **kw)
        if jobs and not lost:  # committed; the answer never arrives
            lost.extend(j.id for j in jobs)
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return jobs

    w.store.claim = lossy  # type: ignore[method-assign]
    th = threading.Thread(target=w.run, daemon=True)
    with caplog.at_level(logging.WARNING, logger="fairq.worker"):
        th.start()
        try:
            wait_for(lambda: count(dsn, "id = ANY(%s) AND status = 'done'", (ids,)) == len(ids),
                     timeout=60, what="every job, the lost claim's included")
        finally:
            w.stop()
            th.join(30)
            app.close()
    assert lost
    assert sorted(i for i, _ in ran) == sorted(ids)  # each ran once
    assert all(a == 1 for i, a in ran if i in lost), "the lost claim's attempt was not undone"
    assert w.stats.released == len(lost)
    assert any("handed back" in r.getMessage() for r in caplog.records)
    assert sum("database connection lost" in r.getMessage() for r in caplog.records) == 1


def test_pools_reconnect_at_a_capped_pace() -> None:
    """psycopg_pool doubles its wait between connection attempts without a cap (1, 2, 4, 8 s
    ...): its 4th failed attempt comes 7 s after the first. Ours try at least every
    POOL_RECONNECT_CAP s: 4 attempts within 3 s."""
    assert all(reconnect_delay(d) <= POOL_RECONNECT_CAP for d in (0.5, 1.0, 8.0, 64.0))
    port = pgcluster.free_port()  # nothing listens there
    pool = Pool(f"postgresql://postgres@127.0.0.1:{port}/postgres", min_size=1, open=False,
                name="capped")
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    pool.open(wait=False)
    try:
        wait_for(lambda: pool.get_stats().get("connections_errors", 0) >= 4, timeout=6.5,
                 what="4 connection attempts (psycopg_pool's own pace: 7 s)", interval=0.05)
    finally:
        pool.close()


def test_a_lease_renewed_after_it_expired_but_before_a_reap_stays_its_workers(dsn: str) -> None:
    app = fairq.App(dsn)
    try:
        job_id = app.enqueue("t", tenant="a")
        store = app.store
        claimed = store.claim(get_policy("fifo"), queue="default", batch=1, worker="w1")
        assert [c.id for c in claimed] == [job_id]
        sql(dsn, "UPDATE fairq.jobs SET locked_until = now() - interval '1 minute' WHERE id = %s",
            (job_id,))
        assert store.extend_leases([(job_id, 1)]) == {job_id}
        assert store.reap_expired().total == 0
        assert [f.id for f in store.finish_done([(job_id, 1)])] == [job_id]
    finally:
        app.close()


def test_psycopg_pools_per_attempt_warnings_are_silenced_in_the_worker_its_errors_kept() -> None:
    pool_log = logging.getLogger("psycopg.pool")
    quiet_pool_logs()
    quiet_pool_logs()  # once per process, however many workers
    assert sum(isinstance(f, PoolNoise) for f in pool_log.filters) == 1

    def passes(level: int, msg: str) -> bool:
        return bool(pool_log.filter(pool_log.makeRecord("psycopg.pool", level, __file__, 1, msg,
                                                        ("x",), None)))

    assert not passes(logging.WARNING, "error connecting in %r: connection refused")
    assert not passes(logging.WARNING, "discarding broken connection: %s")
    assert passes(logging.WARNING, "reconnection attempt in pool %r failed after %s sec")
    assert passes(logging.ERROR, "error connecting in %r: connection refused")


def test_outage_lines_and_grace() -> None:
    """Two lines per outage however many errors; a storm is one outage; connected_for counts
    from the first success after the last error."""
    now = [100.0]
    reconnects: list[int] = []
    logs: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                logs.append(record.getMessage())

    log = logging.getLogger("test.outage")
    log.addHandler(Capture())
    o = Outage(log, on_reconnect=lambda: reconnects.append(1), clock=lambda: now[0])
    assert o.connected_for() == 0.0
    o.ok()
    now[0] += 3
    assert o.connected_for() == 3.0
    for _ in range(50):  # a storm: errors 0.2 s apart, successes between them
        o.lost(psycopg.OperationalError("gone"), 0.1)
        now[0] += 0.1
        o.ok()
        now[0] += 0.1
    assert o.down and o.connected_for() == pytest.approx(0.1)
    now[0] += 1.0
    o.ok()
    assert not o.down and reconnects == [1]
    assert len(logs) == 2 and "lost" in logs[0] and "back after 9.9s" in logs[1], logs


# -- slow ----------------------------------------------------------------------------------------
@slow
@pytest.mark.timeout(300)
def test_immediate_restart_under_load(tmp_path: Path) -> None:
    with private_cluster(tmp_path, synchronous_commit="on") as holder:
        dsn = migrated_db(holder[0])

        def fault() -> float:
            holder[0] = restart(holder[0], "immediate")
            return time.time()

        under_load(tmp_path, dsn, fault, hold=12.0)


@slow
@pytest.mark.timeout(400)
def test_server_refusing_connections_for_30_s_under_load(tmp_path: Path) -> None:
    """Every lease (5 s and 3 s) expires while the server is away; the two long jobs run
    through it. No reaper may return them before their workers renew them (decision 016), and
    the producer's pool comes back within seconds, not at psycopg_pool's doubling pace."""
    with private_cluster(tmp_path, synchronous_commit="on") as holder:
        dsn = migrated_db(holder[0])

        def fault() -> float:
            holder[0] = hold_down(holder[0], 30.0)
            return time.time()

        figures = under_load(tmp_path, dsn, fault, hold=45.0)
        assert figures["enqueue_back_after_s"] <= 5.0, figures
