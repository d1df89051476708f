"""Per-tenant rate limits (a token bucket per queue and tenant, enforced by the claim).

Claims are driven directly through the store where the figure is exact (bursts, a rate change,
work conservation with dry tenants), and through real worker processes for the rate itself,
measured from the jobs' ``started_at`` (the database clock).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import fairq
from fairq.admin.tenant_file import load_tenant_file
from fairq.cli import main
from fairq.errors import InvalidInput
from fairq.policies import get_policy
from fairq.store import Store
from tests.support.fairtools import fill, running_mismatch, sql_rows
from tests.support.paths import REPO, SUPPORT

WEIGHTED = get_policy("weighted")
WORKER = SUPPORT / "worker_proc.py"


@pytest.fixture
def app(dsn: str) -> Any:
    a = fairq.App(dsn, schema="fairq")
    yield a
    a.close()


def claim(store: Store, batch: int, queue: str = "default") -> list[str]:
    return [j.tenant for j in store.claim(WEIGHTED, queue=queue, batch=batch, worker="w")]


def row(dsn: str, tenant: str, queue: str = "default") -> dict[str, Any]:
    (r,) = sql_rows(dsn, """
        SELECT ts.active, extract(epoch FROM ts.wake_at - now())::float8, ts.rate, ts.burst,
               fairq.tenant_tokens(ts)
        FROM fairq.tenant_schedule ts WHERE ts.queue = %s AND ts.tenant = %s""", (queue, tenant))
    return dict(zip(("active", "wake_in", "rate", "burst", "tokens"), r, strict=True))


def wait_until(pred: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


# -- the bucket in the claim ------------------------------------------------------------------
def test_a_burst_starts_at_once_then_the_tenant_sleeps_until_its_next_token(
        app: fairq.App, store: Store, dsn: str) -> None:
    app.tenants.set("acme", rate=0.5, burst=10, max_running=1000)
    fill(store, {"acme": 40, "other": 40})
    got = claim(store, 30)
    assert got.count("acme") == 10          # the whole bucket at once, no more
    r = row(dsn, "acme")
    assert not r["active"]                   # out of the runnable set: no claim walks it
    assert 0 < r["wake_in"] <= 2.0 + 0.05    # its next token, at 0.5/s
    assert abs(r["tokens"]) < 0.1              # refilled only since the claim
    for _ in range(3):                       # until then its slots go to the others
        assert "acme" not in claim(store, 5)
    assert running_mismatch(dsn) == []


def test_the_tenant_comes_back_when_its_token_is_due_and_takes_one_per_token(
        app: fairq.App, store: Store, dsn: str) -> None:
    # 2 tokens a second: the next token is 0.5 s away, a margin a slow machine's two claims
    # keep (at 20 a second, 50 ms, a loaded CI box once took a second token in between)
    app.tenants.set("acme", rate=2.0, burst=2)
    fill(store, {"acme": 50})
    assert claim(store, 10) == ["acme", "acme"]
    assert claim(store, 10) == []            # dry: nothing claimable yet
    wait_until(lambda: row(dsn, "acme")["wake_in"] <= 0)
    got = claim(store, 10)                   # woken by the claim itself (no maintenance)
    assert got.count("acme") == 1


def test_a_bucket_refills_while_idle_but_never_beyond_burst(
        app: fairq.App, store: Store, dsn: str) -> None:
    app.tenants.set("acme", rate=50.0, burst=3)
    fill(store, {"acme": 3})
    assert len(claim(store, 10)) == 3
    time.sleep(0.5)                          # 25 tokens' worth of idling
    assert row(dsn, "acme")["tokens"] == pytest.approx(3.0)
    fill(store, {"acme": 20})
    assert len(claim(store, 20)) == 3


def test_a_rate_change_takes_effect_on_the_next_claim(app: fairq.App, store: Store, dsn: str) -> None:
    app.tenants.set("acme", rate=0.01, burst=1, max_running=1000)
    fill(store, {"acme": 100})
    assert claim(store, 10) == ["acme"]
    assert row(dsn, "acme")["wake_in"] > 50  # asleep for ~100 s at the old rate
    app.tenants.set("acme", rate=1000.0, burst=5)
    time.sleep(0.02)
    assert 1 <= len(claim(store, 10)) <= 5   # the next claim: woken, new rate and burst
    app.tenants.set("acme", rate=None)       # unlimited again
    assert len(claim(store, 10)) == 10
    app.tenants.set("acme", rate=0.01, burst=4)
    assert len(claim(store, 10)) == 4        # a first limit starts with a full bucket
    assert claim(store, 10) == []


def test_fifo_respects_rate_limits_too(app: fairq.App, store: Store, dsn: str) -> None:
    app.tenants.set("acme", rate=0.01, burst=3)
    fill(store, {"acme": 10, "other": 10})
    got = [j.tenant for j in store.claim(get_policy("fifo"), queue="default", batch=20, worker="w")]
    assert got.count("acme") == 3 and got.count("other") == 10
    assert row(dsn, "acme")["tokens"] == pytest.approx(0.0, abs=0.01)
    assert running_mismatch(dsn) == []


def test_rate_limits_are_per_queue(app: fairq.App, store: Store) -> None:
    app.tenants.set("acme", rate=0.01, burst=2)
    fill(store, {"acme": 10}, queue="a")
    fill(store, {"acme": 10}, queue="b")
    assert len(claim(store, 10, "a")) == 2
    assert len(claim(store, 10, "b")) == 2
    assert claim(store, 10, "a") == [] and claim(store, 10, "b") == []


def test_defaults_apply_to_tenants_without_their_own_configuration(
        app: fairq.App, store: Store) -> None:
    app.tenants.apply({"defaults": {"rate": 0.01, "burst": 3},
                       "tenants": {"free": {"rate": "unlimited"}}})
    fill(store, {"x": 10, "y": 10, "free": 10})
    got = claim(store, 30)
    assert got.count("x") == 3 and got.count("y") == 3 and got.count("free") == 10


@pytest.mark.parametrize("policy", ["round_robin", "weighted", "drr"])
def test_no_empty_claim_while_a_tenant_with_tokens_has_work(
        app: fairq.App, store: Store, dsn: str, policy: str) -> None:
    """Dry tenants, some woken again by new enqueues (which make them active), sort first in
    the walk; the claim still serves the tenant that may run, and retires the dry ones."""
    app.store.set_tenants([], defaults=(1.0, 1000, 0.01, 1))
    dry = {f"d{i:02}": 3 for i in range(40)}
    fill(store, dry)
    pol = get_policy(policy)
    while store.claim(pol, queue="default", batch=50, worker="w"):
        pass
    fill(store, dry)                          # activates every dry tenant again, at V
    app.tenants.set("zz", rate=None)
    fill(store, {"zz": 30})
    got = store.claim(pol, queue="default", batch=10, worker="w")
    assert [j.tenant for j in got] and {j.tenant for j in got} == {"zz"}
    (active,) = sql_rows(dsn, "SELECT count(*) FROM fairq.tenant_schedule WHERE active "
                              "AND tenant LIKE 'd%%'")[0]
    assert active == 0                        # all retired by that claim, with their wake_at
    assert sql_rows(dsn, "SELECT count(*) FROM fairq.tenant_schedule WHERE tenant LIKE 'd%%'"
                         " AND wake_at < now() + interval '90 s'") == [(0,)]
    assert store.wake_stranded_tenants() == 0  # throttled on purpose, not stranded


# -- configuration ----------------------------------------------------------------------------
def test_api_keeps_unset_fields_and_defaults_the_burst(app: fairq.App) -> None:
    t = app.tenants.set("acme", rate=5.0)
    assert (t.rate, t.burst) == (5.0, 5)
    t = app.tenants.set("acme", weight=2.0)
    assert (t.weight, t.rate, t.burst) == (2.0, 5.0, 5)
    t = app.tenants.set("acme", rate=2.5, burst=10)
    assert (t.rate, t.burst) == (2.5, 10)
    assert app.tenants.set("acme", rate=7.0).burst == 10
    t = app.tenants.set("acme", rate=None)
    assert (t.rate, t.burst) == (None, None)
    assert app.tenants.get("acme").rate is None


@pytest.mark.parametrize("kwargs", [
    {"rate": 0}, {"rate": -1.0}, {"rate": math.nan}, {"rate": math.inf}, {"rate": "5"},
    {"rate": True}, {"rate": 2e6}, {"rate": 1.0, "burst": 0}, {"rate": 1.0, "burst": 1.5},
    {"burst": 3}, {"rate": None, "burst": 3},
])
def test_bad_rate_limits_are_refused_and_change_nothing(app: fairq.App, kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput):
        app.tenants.set("acme", **kwargs)
    assert not app.tenants.get("acme").configured


@pytest.mark.parametrize("text", [
    '[tenants.acme]\nrate = 0\n', '[tenants.acme]\nrate = "fast"\n', '[tenants.acme]\nburst = 2\n',
    '[defaults]\nrate = -1\n', '[tenants.acme]\nrate = 1\nburst = 0\n',
])
def test_bad_rate_limits_in_the_toml_file_are_refused(tmp_path: Path, text: str) -> None:
    f = tmp_path / "t.toml"
    f.write_text(text)
    with pytest.raises(InvalidInput):
        load_tenant_file(f)


def test_toml_rate_and_burst_with_defaults(tmp_path: Path) -> None:
    f = tmp_path / "t.toml"
    f.write_text('[defaults]\nrate = 2.0\nburst = 4\n[tenants.a]\nweight = 2\n'
                 '[tenants.b]\nrate = 10\n[tenants.c]\nrate = "unlimited"\n')
    defaults, tenants = load_tenant_file(f)
    assert defaults[2:] == (2.0, 4)
    assert {t.tenant: (t.rate, t.burst) for t in tenants} == {
        "a": (2.0, 4), "b": (10.0, 4), "c": (None, None)}


def test_cli_sets_and_lists_rate_limits(capsys: pytest.CaptureFixture[str], dsn: str) -> None:
    assert main(["--dsn", dsn, "tenants", "set", "acme", "--rate", "5", "--burst", "10"]) == 0
    assert "rate=5/s burst=10" in capsys.readouterr().out
    assert main(["--dsn", dsn, "tenants", "list", "--json"]) == 0
    (t,) = json.loads(capsys.readouterr().out)
    assert (t["rate"], t["burst"]) == (5.0, 10)
    assert main(["--dsn", dsn, "tenants", "set", "acme", "--rate", "unlimited"]) == 0
    capsys.readouterr()
    assert main(["--dsn", dsn, "tenants", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["rate"] is None
    for bad in (["--rate", "0"], ["--rate", "fast"], ["--burst", "0", "--rate", "1"],
                ["--rate", "unlimited", "--burst", "2"], ["--burst", "2"]):
        assert main(["--dsn", dsn, "tenants", "set", "acme", *bad]) == 2, bad
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err


# -- through real workers ---------------------------------------------------------------------
def test_five_per_second_with_a_busy_neighbour_and_two_worker_processes(
        app: fairq.App, dsn: str, tmp_path: Path) -> None:
    """acme (rate 5/s, burst 2, a backlog of 200) and a neighbour whose backlog keeps all 8
    slots of two worker processes busy for the whole measure: acme starts 5/s +/- 10% over
    20 s, counted from started_at, and both processes together respect the rate."""
    rate, burst, seconds = 5.0, 2, 20.0
    app.tenants.set("acme", rate=rate, burst=burst)
    job = {"seconds": 0.05}
    app.enqueue_many("sleepy", [("acme", job)] * 200)
    app.enqueue_many("sleepy", [("neighbour", job)] * 6000)
    procs = [subprocess.Popen(
        [sys.executable, str(WORKER), dsn, "--policy", "weighted", "--concurrency", "4",
         "--poll", "0.5", "--grace", "5"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True, cwd=REPO) for _ in range(2)]
    try:
        def started(tenant: str) -> int:
            return int(sql_rows(dsn, "SELECT count(*) FROM fairq.jobs WHERE tenant = %s "
                                     "AND started_at IS NOT NULL", (tenant,))[0][0])
        wait_until(lambda: started("acme") > 0, timeout=60)
        time.sleep(seconds + 1.0)
        rows = sql_rows(dsn, """
            WITH f AS (SELECT min(started_at) AS t0 FROM fairq.jobs WHERE tenant = 'acme')
            SELECT count(*) FILTER (WHERE j.tenant = 'acme'),
                   count(*) FILTER (WHERE j.tenant = 'neighbour'),
                   count(DISTINCT j.locked_by) FILTER (WHERE j.tenant = 'acme')
            FROM fairq.jobs j, f
            WHERE j.started_at >= f.t0 AND j.started_at < f.t0 + make_interval(secs => %s)""",
            (seconds,))
        acme, neighbour, workers = rows[0]
        queued = sql_rows(dsn, "SELECT count(*) FROM fairq.jobs WHERE tenant = 'neighbour' "
                               "AND status = 'queued'")[0][0]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(60)
    measured = (acme - burst) / seconds      # the burst at the start, then the rate
    print(f"acme {acme} jobs in {seconds} s: {measured:.2f}/s; neighbour {neighbour}")
    assert rate * 0.9 <= measured <= rate * 1.1, f"{acme} acme jobs in {seconds} s"
    assert queued > 0, "the neighbour's backlog ran out: the slots were not all busy"
    assert neighbour > 10 * acme
    assert workers == 2, "both processes served acme"


def test_a_lone_rate_limited_tenant_is_served_at_its_rate_not_at_the_poll_interval(
        app: fairq.App, dsn: str) -> None:
    """No neighbour keeps the workers claiming: the worker sleeps until the tenant's next token
    (the queue's first wake_at), not until its 5-second poll."""
    app.tenants.set("acme", rate=10.0, burst=1)
    done = threading.Event()
    count = [0]

    @app.task(name="tick")
    def tick(job: fairq.Job) -> None:
        count[0] += 1
        if count[0] == 20:
            done.set()

    app.enqueue_many("tick", [("acme", {})] * 20)
    w = app.worker(policy="weighted", concurrency=2, poll_interval=5.0)
    t = threading.Thread(target=w.run, daemon=True)
    t0 = time.monotonic()
    t.start()
    try:
        assert done.wait(30), f"{count[0]} of 20 done"
        elapsed = time.monotonic() - t0
    finally:
        w.stop()
        t.join(30)
    (span,) = sql_rows(dsn, "SELECT extract(epoch FROM max(started_at) - min(started_at))::float8 "
                            "FROM fairq.jobs")[0]
    assert 1.9 * 0.9 <= span <= 1.9 * 1.25, span   # 19 tokens at 10/s after the first
    assert elapsed < 10


def test_the_exporter_shows_rate_limits_tokens_and_throttling(
        app: fairq.App, store: Store, dsn: str) -> None:
    from prometheus_client import CollectorRegistry

    from fairq.metrics.exporter import DatabaseCollector

    app.tenants.set("acme", rate=0.01, burst=3)
    fill(store, {"acme": 10})
    assert claim(store, 2) == ["acme", "acme"]   # one token left: not throttled
    fill(store, {"free": 2})
    c = DatabaseCollector(dsn, "fairq", max_tenants=50, interval=0, window=300)
    try:
        registry = CollectorRegistry()
        registry.register(c)

        def value(name: str, tenant: str) -> float | None:
            return registry.get_sample_value(name, {"queue": "default", "tenant": tenant})

        assert value("fairq_tenant_rate_limit", "acme") == 0.01
        assert value("fairq_tenant_rate_tokens", "acme") == pytest.approx(1.0, abs=0.05)
        assert value("fairq_tenant_throttled", "acme") == 0
        assert value("fairq_tenant_rate_limit", "free") is None   # no limit, no series
        claim(store, 10)                  # its last token: asleep until the next one
        assert value("fairq_tenant_rate_tokens", "acme") == pytest.approx(0.0, abs=0.05)
        assert value("fairq_tenant_throttled", "acme") == 1
    finally:
        c.close()


# -- time spent throttled ---------------------------------------------------------------------
def throttled(dsn: str, tenant: str) -> tuple[float, float, Any]:
    """(credited seconds, credited + the open interval, throttled_since) of one tenant."""
    (r,) = sql_rows(dsn, "SELECT ts.throttled_seconds, fairq.throttled_total(ts), ts.throttled_since "
                         "FROM fairq.tenant_schedule ts WHERE ts.queue = 'default' AND ts.tenant = %s",
                    (tenant,))
    return r[0], r[1], r[2]


def test_a_throttled_tenant_accrues_the_time_it_waited_for_tokens(
        app: fairq.App, dsn: str) -> None:
    """acme (4/s, burst 1) with a backlog beside an unlimited tenant, through a worker: its
    throttled seconds are the time between its starts (it always had a due job), less the
    worker's lateness after each token, and never more; the unlimited tenant accrues none.
    The exporter's counter and `fairq stats` show the same figure."""
    from prometheus_client import CollectorRegistry

    from fairq.metrics.exporter import DatabaseCollector
    from fairq.metrics.stats import table_rows, tenant_stats

    app.tenants.set("acme", rate=4.0, burst=1)
    done = threading.Event()
    count = [0]

    @app.task(name="tick")
    def tick(job: fairq.Job) -> None:
        if job.tenant == "acme":
            count[0] += 1
            if count[0] == 13:
                done.set()

    app.enqueue_many("tick", [("acme", {})] * 13 + [("free", {})] * 40)
    w = app.worker(policy="weighted", concurrency=2, poll_interval=5.0)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        assert done.wait(30), f"{count[0]} of 13 done"
    finally:
        w.stop()
        t.join(30)
    (span,) = sql_rows(dsn, "SELECT extract(epoch FROM max(started_at) - min(started_at))::float8 "
                            "FROM fairq.jobs WHERE tenant = 'acme'")[0]
    credited, total, since = throttled(dsn, "acme")
    print(f"acme: 13 starts over {span:.3f} s, throttled {credited:.3f} s")
    assert span >= 12 / 4.0 * 0.9                  # 12 tokens at 4/s after the first
    assert 0.5 * span <= credited <= span + 0.001  # dry between starts, never outside them
    assert since is None and total == credited     # no job left: no interval open
    assert throttled(dsn, "free")[:2] == (0.0, 0.0)

    c = DatabaseCollector(dsn, "fairq", max_tenants=50, interval=0, window=300)
    try:
        registry = CollectorRegistry()
        registry.register(c)
        sample = registry.get_sample_value
        assert sample("fairq_tenant_throttled_seconds_total",
                      {"queue": "default", "tenant": "acme"}) == pytest.approx(credited)
        assert sample("fairq_tenant_throttled_seconds_total",
                      {"queue": "default", "tenant": "free"}) == 0.0
    finally:
        c.close()
    stats = {s.tenant: s for s in tenant_stats(app)}
    assert stats["acme"].throttled_seconds == pytest.approx(credited)
    assert stats["free"].throttled_seconds == 0.0
    cells = dict(zip(("acme", "free"), table_rows([stats["acme"], stats["free"]]), strict=True))
    assert cells["acme"][7] == f"{credited:.1f}s" and cells["free"][7] == "-"


def test_throttled_time_ends_at_the_token_when_the_rate_changes_or_the_tenant_wakes_early(
        app: fairq.App, store: Store, dsn: str) -> None:
    """A tenant dry for ~100 s at 0.01/s: an enqueue that wakes it early keeps its interval
    open from where it began; raising the rate credits only the time it waited, not the 100 s
    the old rate would have made it wait; removing the limit ends the interval."""
    app.tenants.set("acme", rate=0.01, burst=1, max_running=1000)
    fill(store, {"acme": 50})
    assert claim(store, 10) == ["acme"]
    credited, total, since = throttled(dsn, "acme")
    assert since is not None and credited == 0.0 and 0.0 <= total < 5.0
    fill(store, {"acme": 1})                 # wakes it, still dry
    assert row(dsn, "acme")["active"]
    assert claim(store, 10) == [] and not row(dsn, "acme")["active"]   # retired dry again
    assert throttled(dsn, "acme")[2] == since  # the same interval, from its start
    app.tenants.set("acme", rate=1000.0, burst=1)
    wait_until(lambda: row(dsn, "acme")["tokens"] >= 1)
    assert claim(store, 1) == ["acme"]
    credited, total, _ = throttled(dsn, "acme")
    (elapsed,) = sql_rows(dsn, "SELECT extract(epoch FROM now() - %s::timestamptz)::float8",
                          (since,))[0]
    assert 0.0 < credited <= elapsed < 5.0  # not the ~100 s of the old rate
    app.tenants.set("acme", rate=None)
    assert throttled(dsn, "acme")[2] is None
    assert throttled(dsn, "acme")[0] == pytest.approx(throttled(dsn, "acme")[1])
