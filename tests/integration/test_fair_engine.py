"""The fair engine against the real PostgreSQL: the properties of docs/algorithm.md ("Invariants")."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from fairq.models import NewJob, TenantConfig
from fairq.policies import get_policy
from fairq.policies.fairness import jain_index
from fairq.store import Store
from tests.support.fairtools import counts, drain_concurrently, fill, running_mismatch, sql_rows

FAIR = ["round_robin", "weighted", "drr"]
ALL = ["fifo", *FAIR]


@pytest.fixture
def uncapped(store: Store) -> Store:
    store.set_tenants([], defaults=(1.0, 100_000))
    return store


@pytest.mark.parametrize("policy", FAIR)
def test_ten_claims_of_ten_serve_each_of_ten_backlogged_tenants_one_batch(
        uncapped: Store, policy: str) -> None:
    # No share of the batch per tenant: each claim writes one tenant row, as fifo's does, and
    # virtual time takes the next claim to the next tenant.
    fill(uncapped, {f"t{i}": 20 for i in range(10)})
    claims = [uncapped.claim(get_policy(policy), queue="default", batch=10, worker="w")
              for _ in range(10)]
    assert [len(c) for c in claims] == [10] * 10
    assert [len({j.tenant for j in c}) for c in claims] == [1] * 10
    assert sorted(c[0].tenant for c in claims) == [f"t{i}" for i in range(10)]


@pytest.mark.parametrize("policy", ["round_robin", "weighted"])
def test_noisy_neighbour_eight_workers_every_claim_useful_small_tenants_first(
        uncapped: Store, policy: str) -> None:
    fill(uncapped, {"t1": 1000})
    fill(uncapped, {f"t{i}": 5 for i in range(2, 12)})
    res = drain_concurrently(uncapped, policy, workers=8, batch=1, total=1050)
    assert res.errors == []
    assert len(res.order) == 1050
    assert res.empty_while_work == 0
    last_small = max(i for i, t in enumerate(res.order) if t != "t1")
    assert last_small < 70, f"small tenants' last job at claim {last_small + 1}"


def test_noisy_neighbour_under_fifo_waits_behind_the_big_tenant(uncapped: Store) -> None:
    fill(uncapped, {"t1": 1000})
    fill(uncapped, {f"t{i}": 5 for i in range(2, 12)})
    res = drain_concurrently(uncapped, "fifo", workers=8, batch=1, total=1050)
    assert min(i for i, t in enumerate(res.order) if t != "t1") >= 990


@pytest.mark.parametrize("batch", [1, 10])
def test_weighted_three_to_one_gets_75_percent(uncapped: Store, batch: int) -> None:
    uncapped.set_tenants([TenantConfig("gold", 3.0, 100_000), TenantConfig("free", 1.0, 100_000)])
    fill(uncapped, {"gold": 1500, "free": 1500}, interleave=True)
    res = drain_concurrently(uncapped, "weighted", workers=4, batch=batch, total=3000,
                             stop_after=1000)
    share = counts(res.order[:1000])["gold"] / 1000
    assert 0.70 <= share <= 0.80, share


def test_ten_random_weights_reach_jain_099(uncapped: Store) -> None:
    rng = random.Random(7)
    weights = {f"t{i}": rng.choice([0.5, 1, 2, 3, 5]) * 1.0 for i in range(10)}
    uncapped.set_tenants([TenantConfig(t, w, 100_000) for t, w in weights.items()])
    fill(uncapped, {t: 1000 for t in weights}, interleave=True)
    res = drain_concurrently(uncapped, "weighted", workers=8, batch=4, total=10_000,
                             stop_after=2000)
    served = counts(res.order[:2000])
    assert jain_index([served.get(t, 0) / w for t, w in weights.items()]) >= 0.99


def test_drr_serves_costly_tenant_a_tenth_as_many_jobs(uncapped: Store) -> None:
    fill(uncapped, {"heavy": 300, "light": 3000}, cost={"heavy": 10.0}, interleave=True)
    res = drain_concurrently(uncapped, "drr", workers=4, batch=5, total=3300, stop_after=1100)
    c = counts(res.order[:1100])
    assert 8.5 <= c["light"] / c["heavy"] <= 11.5, c


@pytest.mark.parametrize("policy", ALL)
def test_one_busy_tenant_many_workers_no_empty_claims(uncapped: Store, policy: str) -> None:
    fill(uncapped, {"busy": 3000})
    res = drain_concurrently(uncapped, policy, workers=8, batch=5, total=3000)
    assert res.errors == [] and len(res.order) == 3000
    assert res.empty_while_work == 0


@pytest.mark.parametrize("policy", ALL)
def test_caps_never_exceeded_under_eight_concurrent_claimers(store: Store, dsn: str, policy: str) -> None:
    caps = {"a": 3, "b": 1, "c": 5, "d": 0}
    store.set_tenants([TenantConfig(t, 1.0, c) for t, c in caps.items()])
    fill(store, {t: 60 for t in caps}, interleave=True)
    pol = get_policy(policy)
    # The caps are reached, deterministically: one claim larger than their sum fills each one.
    first = store.claim(pol, queue="default", batch=20, worker="w-first")
    assert counts([j.tenant for j in first]) == {"a": 3, "b": 1, "c": 5}
    store.finish_done([(j.id, j.attempts) for j in first])
    seen: dict[str, int] = {}
    stop = threading.Event()

    def monitor() -> None:
        while not stop.is_set():
            for tenant, n in sql_rows(dsn, "SELECT tenant, count(*) FROM fairq.jobs "
                                           "WHERE status = 'running' GROUP BY 1"):
                seen[tenant] = max(seen.get(tenant, 0), n)

    errors: list[str] = []
    done = [len(first)]
    lock = threading.Lock()

    def worker(n: int) -> None:
        rng = random.Random(n)
        while True:
            with lock:
                if done[0] >= 180:
                    return
            try:
                got = store.claim(pol, queue="default", batch=rng.randint(1, 6), worker=f"w{n}")
                time.sleep(rng.random() * 0.01)
                store.finish_done([(j.id, j.attempts) for j in got])
            except Exception as exc:
                errors.append(repr(exc))
                return
            with lock:
                done[0] += len(got)

    mon = threading.Thread(target=monitor)
    mon.start()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    stop.set()
    mon.join()
    assert errors == []
    assert done[0] == 180  # a, b, c drained; d paused
    assert all(seen.get(t, 0) <= cap for t, cap in caps.items()), seen
    paused = "SELECT count(*) FROM fairq.jobs WHERE tenant = 'd' AND status = 'queued'"
    assert sql_rows(dsn, paused) == [(60,)]
    assert running_mismatch(dsn) == []


def test_paused_tenant_resumes_on_the_next_claim(store: Store) -> None:
    store.set_tenants([TenantConfig("p", 1.0, 0)])
    fill(store, {"p": 3})
    pol = get_policy("weighted")
    assert store.claim(pol, queue="default", batch=5, worker="w") == []
    store.set_tenants([TenantConfig("p", 1.0, 2)])
    assert len(store.claim(pol, queue="default", batch=5, worker="w")) == 2


def test_weight_change_takes_effect_on_the_next_claim(uncapped: Store) -> None:
    fill(uncapped, {"a": 400, "b": 400}, interleave=True)
    pol = get_policy("weighted")
    first = counts(j.tenant for _ in range(20)
                   for j in uncapped.claim(pol, queue="default", batch=5, worker="w"))
    assert abs(first["a"] - first["b"]) <= 5
    uncapped.set_tenants([TenantConfig("a", 4.0, 100_000)])
    after = counts(j.tenant for _ in range(20)
                   for j in uncapped.claim(pol, queue="default", batch=5, worker="w"))
    assert 0.72 <= after["a"] / 100 <= 0.88, after


@pytest.mark.parametrize("policy", FAIR)
def test_idle_tenant_banks_no_credit(uncapped: Store, policy: str) -> None:
    pol = get_policy(policy)
    fill(uncapped, {"busy": 2000, "idle": 1})
    for _ in range(100):      # 'busy' is served alone for a long time; 'idle' goes idle
        uncapped.claim(pol, queue="default", batch=10, worker="w")
    fill(uncapped, {"idle": 500})
    later = counts(j.tenant for _ in range(20)
                   for j in uncapped.claim(pol, queue="default", batch=5, worker="w"))
    assert later["idle"] <= 60, later   # a fair half of 100, not 100 claims of catch-up


def test_new_tenant_first_job_within_a_round(uncapped: Store) -> None:
    pol = get_policy("round_robin")
    fill(uncapped, {f"t{i:02d}": 50 for i in range(40)}, interleave=True)
    for _ in range(7):
        uncapped.claim(pol, queue="default", batch=4, worker="w")
    fill(uncapped, {"newcomer": 3})
    for _ in range(40 // 4 + 1):       # active tenants / batch claims, plus one
        if any(j.tenant == "newcomer" for j in uncapped.claim(pol, queue="default", batch=4, worker="w")):
            break
    else:
        pytest.fail("newcomer not served within (active tenants / batch) + 1 claims")


@pytest.mark.parametrize("policy", ALL)
def test_delayed_jobs_neither_block_nor_run_early(store: Store, dsn: str, policy: str) -> None:
    pol = get_policy(policy)
    from fairq.models import NewJob

    store.enqueue([NewJob("t", "a", "{}", delay=3600)] * 3 + [NewJob("t", "a", "{}")])
    got = store.claim(pol, queue="default", batch=10, worker="w")
    assert len(got) == 1
    assert store.claim(pol, queue="default", batch=10, worker="w") == []
    # Make them due, as time would: the maintenance wake-up makes the tenant runnable again.
    sql_rows(dsn, "UPDATE fairq.jobs SET run_at = now() - interval '1 s' WHERE status = 'queued';"
                  "UPDATE fairq.tenant_schedule SET wake_at = now() - interval '1 s' WHERE NOT active")
    store.wake_due_tenants()
    assert len(store.claim(pol, queue="default", batch=10, worker="w")) == 3


def test_running_counts_follow_every_way_out(store: Store, dsn: str) -> None:
    fill(store, {"a": 6, "b": 6})
    pol = get_policy("weighted")
    got = store.claim(pol, queue="default", batch=12, worker="w")
    assert len(got) == 12
    store.finish_done([(got[0].id, got[0].attempts)])
    store.finish_failed([(got[1].id, got[1].attempts, "boom", None)])
    sql_rows(dsn, "UPDATE fairq.jobs SET locked_until = now() - interval '1 s' WHERE id = %s",
             (got[2].id,))
    store.reap_expired()
    assert running_mismatch(dsn) == []
    # a stale finish (wrong attempts) changes nothing
    assert store.finish_done([(got[3].id, got[3].attempts + 1)]) == []
    assert running_mismatch(dsn) == []
    store.finish_done([(j.id, j.attempts) for j in got[3:]])
    assert running_mismatch(dsn) == [] and sql_rows(
        dsn, "SELECT sum(fairq.tenant_running(ts)) FROM fairq.tenant_schedule ts") == [(0,)]


@pytest.mark.parametrize("policy", FAIR)
def test_idle_queue_restarts_fresh_old_and_new_tenants_share_equally(uncapped: Store, policy: str) -> None:
    pol = get_policy(policy)
    fill(uncapped, {"veteran": 500})
    while uncapped.claim(pol, queue="default", batch=10, worker="w"):
        pass                                   # veteran served 500 times; queue now idle
    fill(uncapped, {"veteran": 300, "newcomer": 300}, interleave=True)
    first = counts(j.tenant for _ in range(20)
                   for j in uncapped.claim(pol, queue="default", batch=5, worker="w"))
    assert 40 <= first["newcomer"] <= 60, first  # not 100 claims of catch-up either way


def test_all_capped_queue_newcomer_does_not_jump_ahead_forever(store: Store, dsn: str) -> None:
    store.set_tenants([TenantConfig("capped", 1.0, 2)], defaults=(1.0, 1000))
    pol = get_policy("weighted")
    fill(store, {"capped": 200})
    held = store.claim(pol, queue="default", batch=2, worker="w")   # capped is now at its cap
    (vt,), = sql_rows(dsn, "SELECT vtime FROM fairq.tenant_schedule WHERE tenant = 'capped'")
    fill(store, {"newcomer": 50})
    (vn,), = sql_rows(dsn, "SELECT vtime FROM fairq.tenant_schedule WHERE tenant = 'newcomer'")
    assert vn == vt                              # starts at the active tenants' virtual time
    store.finish_done([(j.id, j.attempts) for j in held])


def _wait_until_blocked(dsn: str, pid: int) -> None:
    deadline = time.monotonic() + 10
    while not sql_rows(dsn, "SELECT 1 FROM pg_stat_activity WHERE pid = %s "
                            "AND wait_event_type = 'Lock'", (pid,)):
        assert time.monotonic() < deadline, "the claimer never waited for the held rows"
        time.sleep(0.01)


@pytest.mark.parametrize("policy", ALL)
def test_claim_that_waited_for_held_tenant_rows_claims_with_exact_counts(
        uncapped: Store, dsn: str, policy: str) -> None:
    """Claimer A holds ten tenants' schedule rows (its claim is not committed yet); claimer B
    finds every tenant held and waits (the fair claim's second statement for the first tenant
    with a due job; fifo for the picked jobs' tenants) and, once A commits, claims: never empty
    while work is due, and every tenant's running count stays exact.

    The rows B locks after its wait are newer than its snapshot (EvalPlanQual): the fair claim
    writes them in claim_settle, whose snapshot sees them (writing them from the claim's own
    statement lost the update and let running counts go negative)."""
    import psycopg

    from fairq import sql
    from fairq.store.planner import planner_options

    # Equal weights: A's claim of ten takes one job from each tenant, so it holds them all.
    fill(uncapped, {f"t{i}": 30 for i in range(10)}, interleave=True)
    text = sql.statement(get_policy(policy).statement, "fairq")
    params = get_policy(policy).claim_params(queue="default", batch=10, worker="w")
    a_params = dict(params)
    # B runs the statement the store runs after an empty claim: the fair one with `wait`.
    params["wait"] = get_policy(policy).waits
    with psycopg.connect(dsn, options=planner_options()) as a, \
            psycopg.connect(dsn, autocommit=True, options=planner_options()) as b:
        held = a.execute(text, a_params).fetchall()
        assert len(held) == 10
        pid = b.info.backend_pid
        got: list[object] = []
        t = threading.Thread(target=lambda: got.extend(b.execute(text, params).fetchall()))
        t.start()
        _wait_until_blocked(dsn, pid)
        a.commit()
        t.join(timeout=30)
    assert 1 <= len(got) <= 10, got
    assert not {r[0] for r in got} & {r[0] for r in held}
    assert running_mismatch(dsn) == []


HEAP_XMAX_IS_MULTI = 0x1000  # PostgreSQL's htup_details.h


def _multixact_rows(dsn: str, table: str) -> int:
    """Row versions of ``table`` whose xmax is a MultiXact (pageinspect reads the pages)."""
    (n,), = sql_rows(dsn, f"""
        SELECT count(*) FROM generate_series(
                 0, pg_relation_size('fairq.{table}') / current_setting('block_size')::int - 1) p,
             LATERAL heap_page_items(get_raw_page('fairq.{table}', p::int)) h
        WHERE h.lp_flags = 1 AND (h.t_infomask & {HEAP_XMAX_IS_MULTI}) <> 0""")
    return int(n)


@pytest.mark.parametrize(("room_left", "holder_serves", "wait"),
                         [(100, False, True), (5, False, True), (100, True, True),
                          (100, True, False)])
def test_fair_claim_waits_for_the_only_held_tenant_and_grants_what_fits(
        store: Store, dsn: str, room_left: int, holder_serves: bool, wait: bool) -> None:
    """One busy tenant whose row another session holds (a claim or a finish of another worker):
    the fair claim waits for the row instead of coming back empty (in its first statement when
    it holds nothing, or in the store's second, `wait`), then grants what fits under the cap as
    it is after the wait.

    room_left 100: the holder commits without changing the row; B gets its 10 jobs.
    room_left 5: the holder leaves the tenant 5 free slots; B gets exactly 5.
    holder_serves: the holder moves the tenant's vtime a window on, as a claim does; B still
    gets 10, not the one job a window measured from its older snapshot would allow.
    MultiXacts (a row locked or written in a subtransaction and then updated by its parent
    needs one to keep both ids; a wait that locked the tenant's row or its jobs in a
    subtransaction would make one per row): none. The wait locks the row and the jobs in the
    claim's own transaction (wait_and_pick)."""
    import psycopg

    from fairq import sql
    from fairq.store.planner import planner_options

    sql_rows(dsn, "CREATE EXTENSION IF NOT EXISTS pageinspect")
    store.set_tenants([TenantConfig("t", 2.0, 100)])
    fill(store, {"t": 30})
    params = get_policy("weighted").claim_params(queue="default", batch=10, worker="b")
    params["wait"] = wait  # True: the store's second statement, after the first found it held
    text = sql.statement("claim_fair", "fairq")
    before = sql_rows(dsn, "SELECT running, vtime FROM fairq.tenant_schedule WHERE tenant = 't'")[0]
    a = psycopg.connect(dsn, options=planner_options())
    b = psycopg.connect(dsn, autocommit=True, options=planner_options())
    got: list[object] = []
    t = threading.Thread(target=lambda: got.extend(b.execute(text, params).fetchall()))
    try:
        a.execute("SELECT 1 FROM fairq.tenant_schedule WHERE tenant = 't' FOR NO KEY UPDATE")
        t.start()
        _wait_until_blocked(dsn, b.info.backend_pid)
        if room_left < 100:
            a.execute("UPDATE fairq.tenant_schedule SET max_running = running + %s "
                      "WHERE tenant = 't'", (room_left,))
        if holder_serves:
            a.execute("UPDATE fairq.tenant_schedule SET vtime = vtime + 10 WHERE tenant = 't'")
        a.commit()
    finally:
        a.close()  # releases the row even when an assertion failed, so B can finish
        if t.ident is not None:
            t.join(timeout=30)
        b.close()
    running, vtime = sql_rows(dsn, "SELECT running, vtime FROM fairq.tenant_schedule "
                                   "WHERE tenant = 't'")[0]
    want = min(10, room_left)
    assert len(got) == want
    assert (running, vtime) == (before[0] + want,
                                before[1] + (10 if holder_serves else 0) + want / 2.0)
    assert running_mismatch(dsn) == []
    assert (_multixact_rows(dsn, "tenant_schedule"), _multixact_rows(dsn, "jobs")) == (0, 0)


@pytest.mark.parametrize("policy", FAIR)
def test_a_waited_claim_that_takes_a_tenants_last_jobs_retires_it(uncapped: Store, dsn: str,
                                                                 policy: str) -> None:
    """Claim A takes 10 of tenant "t"'s 15 jobs and has not committed; claim B finds "t" held,
    picks the other 5, waits for A, and takes them: "t" has no due job left, so B's write must
    take it out of the runnable set (docs/algorithm.md, step 5). B's statement snapshot is
    older than A's commit, so it still sees A's 10 jobs as queued: a due-job probe in that
    snapshot kept "t" runnable and empty, for some later claim's walk to find."""
    import psycopg

    from fairq import sql
    from fairq.store.planner import planner_options

    fill(uncapped, {"t": 15})
    text = sql.statement(get_policy(policy).statement, "fairq")
    params = get_policy(policy).claim_params(queue="default", batch=10, worker="w")
    with psycopg.connect(dsn, options=planner_options()) as a, \
            psycopg.connect(dsn, autocommit=True, options=planner_options()) as b:
        held = a.execute(text, params).fetchall()
        assert len(held) == 10
        got: list[object] = []
        t = threading.Thread(target=lambda: got.extend(b.execute(text, params).fetchall()))
        t.start()
        _wait_until_blocked(dsn, b.info.backend_pid)
        a.commit()
        t.join(timeout=30)
    assert len(got) == 5
    assert sql_rows(dsn, "SELECT active, fairq.tenant_running(ts) FROM fairq.tenant_schedule ts "
                         "WHERE tenant = 't'") == [(False, 15)]
    assert running_mismatch(dsn) == []


def test_rebase_keeps_virtual_time_small_and_its_order(uncapped: Store, dsn: str) -> None:
    """Virtual time grows for as long as a queue has work. Far from zero a float8 absorbs small
    increments (at 2^53, adding 1/1000 changes nothing, and the tenant would stay first for
    ever); the maintenance rebase subtracts the queue's integer part, keeping the differences."""
    uncapped.set_tenants([TenantConfig("heavy", 1000.0, 100_000), TenantConfig("light", 1.0, 100_000)])
    fill(uncapped, {"heavy": 50, "light": 50}, interleave=True)
    far = float(2 ** 53)
    sql_rows(dsn, "UPDATE fairq.tenant_schedule SET vtime = %s + CASE tenant WHEN 'light' "
                  "THEN 4 ELSE 0 END", (far,))
    pol = get_policy("weighted")
    got = uncapped.claim(pol, queue="default", batch=1, worker="w")
    assert [j.tenant for j in got] == ["heavy"]
    (stuck,), = sql_rows(dsn, "SELECT vtime FROM fairq.tenant_schedule WHERE tenant = 'heavy'")
    assert stuck == far  # the 1/1000 was absorbed: the defect the rebase exists for
    assert uncapped.rebase_vtime() == 2
    rows = dict(sql_rows(dsn, "SELECT tenant, vtime FROM fairq.tenant_schedule"))
    assert rows == {"heavy": 0.0, "light": 4.0}
    got = uncapped.claim(pol, queue="default", batch=1, worker="w")
    assert [j.tenant for j in got] == ["heavy"]
    (moved,), = sql_rows(dsn, "SELECT vtime FROM fairq.tenant_schedule WHERE tenant = 'heavy'")
    assert moved == 1 / 1000
    assert uncapped.rebase_vtime() == 0  # below the threshold: nothing to do


def test_a_claim_retires_at_most_a_walks_worth_of_tenants_behind_its_stop(uncapped: Store,
                                                                         dsn: str) -> None:
    """claim_settle takes the runnable tenants before the walk's stop as walked past and
    retires those without a due job. The stop is read from rows the walk locked, which a
    concurrent claim may have moved on since the snapshot, so it can lie far past where the
    walk was: the tenants taken as walked past are the 1,000 just before the stop (the walk's
    own bound; claim_settle reads them backwards from it), not every tenant before it.
    1,500 active tenants without a job, a stop past all of them: the last 1,000 are retired by
    this claim, the rest by the next."""
    fill(uncapped, {f"t{i:04d}": 1 for i in range(1500)})
    sql_rows(dsn, "UPDATE fairq.jobs SET status = 'cancelled'")  # active, nothing due
    settle = ("SELECT fairq.claim_settle('default', false, 1e9::float8, 1e9::float8, 'zzzz', "
              "'{}'::tid[], '{}'::text[], '{}'::int[], '{}'::float8[], '{}'::text[], "
              "'{}'::tid[], '{}'::text[])")
    active = "SELECT min(tenant), max(tenant), count(*) FROM fairq.tenant_schedule WHERE active"
    assert sql_rows(dsn, settle) == [(1000,)]
    assert sql_rows(dsn, active) == [("t0000", "t0499", 500)]
    assert sql_rows(dsn, settle) == [(500,)]
    assert sql_rows(dsn, active) == [(None, None, 0)]


def test_the_tenants_before_the_stop_keep_their_place_while_they_have_a_due_job(
        uncapped: Store, dsn: str) -> None:
    """Taken as walked past is only suspected: each is probed under its lock, and one with a due
    job stays runnable, whichever tenants the read before the stop returns. 300 tenants at one
    virtual time, every third without a due job, a stop at the 200th: of the 199 before it,
    the 67 without one are retired, and nobody after the stop is touched."""
    fill(uncapped, {f"t{i:04d}": 1 for i in range(300)})
    sql_rows(dsn, "UPDATE fairq.jobs SET status = 'cancelled' "
                  "WHERE right(tenant, 4)::int % 3 = 0")
    settle = ("SELECT fairq.claim_settle('default', false, 1e9::float8, "
              "(SELECT vtime FROM fairq.tenant_schedule WHERE tenant = 't0199'), 't0199', "
              "'{}'::tid[], '{}'::text[], '{}'::int[], '{}'::float8[], '{}'::text[], "
              "'{}'::tid[], '{}'::text[])")
    assert sql_rows(dsn, "SELECT count(DISTINCT vtime) FROM fairq.tenant_schedule") == [(1,)]
    assert sql_rows(dsn, settle) == [(67,)]  # t0000, t0003, ..., t0198
    idle = sql_rows(dsn, "SELECT tenant FROM fairq.tenant_schedule WHERE NOT active ORDER BY 1")
    assert [t for (t,) in idle] == [f"t{i:04d}" for i in range(0, 199, 3)]
    # and every tenant left runnable has a due job, except those after the stop
    assert sql_rows(dsn, """
        SELECT count(*) FROM fairq.tenant_schedule ts WHERE ts.active AND ts.tenant < 't0199'
          AND NOT EXISTS (SELECT FROM fairq.jobs j WHERE j.tenant = ts.tenant
                          AND j.status = 'queued')""") == [(0,)]


@pytest.mark.parametrize("policy", FAIR)
def test_the_wait_skips_a_tenant_whose_last_job_went_while_it_waited(uncapped: Store, dsn: str,
                                                                    policy: str) -> None:
    """Both tenants' rows are held, so the claim's first statement takes nothing and the second
    waits for the first tenant with a due job, "a". The claim holding "a" takes its only job and
    commits; "b" is free by then. The wait must go on to "b", not return "a" with nothing to
    take (that claim came back empty while "b" had 20 jobs)."""
    import psycopg

    ids = fill(uncapped, {"a": 1, "b": 20})
    holder_a = psycopg.connect(dsn)
    holder_b = psycopg.connect(dsn)
    try:
        holder_b.execute("SELECT 1 FROM fairq.tenant_schedule WHERE tenant = 'b' "
                         "FOR NO KEY UPDATE")
        holder_a.execute("SELECT 1 FROM fairq.tenant_schedule WHERE tenant = 'a' "
                         "FOR NO KEY UPDATE")
        holder_a.execute("UPDATE fairq.jobs SET status = 'running', attempts = 1, "
                         "started_at = now(), locked_until = now() + interval '1 hour' "
                         "WHERE id = %s", (ids[0],))
        got: list[list[str]] = []
        claimer = threading.Thread(target=lambda: got.append([j.tenant for j in uncapped.claim(
            get_policy(policy), queue="default", batch=1, worker="w")]))
        claimer.start()
        deadline = time.monotonic() + 30
        # Waiting for "a"'s row: a backend of this database blocked on a lock.
        while not sql_rows(dsn, "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
                                "AND wait_event_type = 'Lock'"):
            assert time.monotonic() < deadline, "the claim never waited for the held tenant"
            time.sleep(0.01)
        holder_b.commit()
        holder_a.commit()
        claimer.join(30)
        assert got == [["b"]]
    finally:
        holder_a.close()
        holder_b.close()


def _blocked_by(dsn: str, pid: int, holder: int) -> None:
    """Return once backend ``pid`` waits for a lock ``holder`` holds (or waits ahead for)."""
    deadline = time.monotonic() + 30
    while not sql_rows(dsn, "SELECT 1 WHERE %s = ANY (pg_blocking_pids(%s))", (holder, pid)):
        assert time.monotonic() < deadline, f"backend {pid} never waited for {holder}"
        time.sleep(0.01)


@pytest.mark.parametrize("policy", FAIR)
def test_a_wait_left_holding_a_tenant_without_room_waits_for_no_other_row(
        uncapped: Store, dsn: str, policy: str) -> None:
    """Tenants "a" and "b" both held: the claim waits for "a" (first in order). "a"'s holder
    takes it to its cap and commits, while "b"'s holder, which keeps "b", asks for "a" too (a
    finish or a fifo claim locks its tenants in name order). The claim now holds "a", with no
    room to serve: waiting for "b" would close a cycle (the claim waits for "b"'s holder, which
    waits for the claim), which PostgreSQL breaks by failing one of them after deadlock_timeout.
    The wait locks "b" SKIP LOCKED instead, comes back empty and lets "a" go; the store's second
    statement, holding nothing, waits for "b" and gets its jobs once "b"'s holder commits."""
    import psycopg

    fill(uncapped, {"a": 5, "b": 5})
    holder_a = psycopg.connect(dsn)
    holder_b = psycopg.connect(dsn)
    errors: list[BaseException] = []
    got: list[list[str]] = []

    def claim() -> None:
        try:
            got.append([j.tenant for j in uncapped.claim(get_policy(policy), queue="default",
                                                         batch=10, worker="w")])
        except BaseException as e:  # reported by the assertion below
            errors.append(e)

    def b_takes_a() -> None:
        try:
            holder_b.execute("SELECT 1 FROM fairq.tenant_schedule WHERE tenant = 'a' "
                             "FOR NO KEY UPDATE")
        except BaseException as e:  # reported by the assertion below
            errors.append(e)

    claimer = threading.Thread(target=claim)
    b_waits = threading.Thread(target=b_takes_a)
    try:
        holder_a.execute("SELECT 1 FROM fairq.tenant_schedule WHERE tenant = 'a' "
                         "FOR NO KEY UPDATE")
        holder_b.execute("SELECT 1 FROM fairq.tenant_schedule WHERE tenant = 'b' "
                         "FOR NO KEY UPDATE")
        claimer.start()
        claimer_pid = _the_lock_waiter(dsn)
        _blocked_by(dsn, claimer_pid, holder_a.info.backend_pid)
        b_waits.start()  # queued behind the claim for "a"
        _blocked_by(dsn, holder_b.info.backend_pid, claimer_pid)
        holder_a.execute("UPDATE fairq.tenant_schedule SET max_running = running "
                         "WHERE tenant = 'a'")
        holder_a.commit()
        b_waits.join(30)  # "b"'s holder gets "a" once the claim's first statement ends
        assert not b_waits.is_alive() and not errors, errors
        # The store's second statement waits for "b" now.
        _blocked_by(dsn, claimer_pid, holder_b.info.backend_pid)
        holder_b.commit()
        claimer.join(30)
        assert not errors, errors
        assert got == [["b"] * 5]
    finally:
        holder_a.close()
        holder_b.close()
        claimer.join(30)
        b_waits.join(30)
    assert running_mismatch(dsn) == []


def _counting(store: Store) -> list[bool]:
    """Record, per statement a claim of ``store`` sends, whether it was the second (``wait``)."""
    sent: list[bool] = []
    claim_rows = store._claim_rows

    def spy(statement: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        sent.append(bool(params.get("wait")))
        return claim_rows(statement, params)

    store._claim_rows = spy  # type: ignore[method-assign]
    return sent


@pytest.mark.parametrize("policy", FAIR)
def test_a_poll_of_a_queue_with_nothing_due_is_one_statement(uncapped: Store, policy: str) -> None:
    """A first statement that took nothing and held no lock has waited itself (it found no
    tenant to wait for): the store sends no second one. Empty queue, then a queue whose only
    tenant waits for a delayed job; each poll is one statement."""
    sent = _counting(uncapped)
    assert uncapped.claim(get_policy(policy), queue="default", batch=10, worker="w") == []
    assert sent == [False]
    uncapped.enqueue([NewJob("t", "later", "{}", delay=3600.0)])
    for _ in range(3):
        assert uncapped.claim(get_policy(policy), queue="default", batch=10, worker="w") == []
    assert sent == [False] * 4


@pytest.mark.parametrize("policy", FAIR)
def test_a_first_statement_that_held_a_tenant_and_took_nothing_is_followed_by_the_wait(
        uncapped: Store, dsn: str, policy: str) -> None:
    """Tenant "a" is first in the walk, its only job locked by another transaction; "b"'s row is
    held by another. The first statement locks "a", takes nothing, skips "b", and cannot wait
    holding "a": it returns its row of NULLs (never handed to the caller), and the second
    statement waits for "b" and takes its jobs once "b"'s holder commits."""
    import psycopg

    ids = fill(uncapped, {"a": 1})
    fill(uncapped, {"b": 3})
    sent = _counting(uncapped)
    job_holder = psycopg.connect(dsn)
    row_holder = psycopg.connect(dsn)
    got: list[list[str]] = []
    try:
        job_holder.execute("SELECT 1 FROM fairq.jobs WHERE id = %s FOR UPDATE", (ids[0],))
        row_holder.execute("SELECT 1 FROM fairq.tenant_schedule WHERE tenant = 'b' "
                           "FOR NO KEY UPDATE")
        claimer = threading.Thread(target=lambda: got.append([j.tenant for j in uncapped.claim(
            get_policy(policy), queue="default", batch=10, worker="w")]))
        claimer.start()
        _blocked_by(dsn, _the_lock_waiter(dsn), row_holder.info.backend_pid)
        assert sent == [False, True]
        row_holder.commit()
        claimer.join(30)
        assert got == [["b"] * 3]
    finally:
        row_holder.close()
        job_holder.close()
    assert running_mismatch(dsn) == []


def test_a_policy_that_does_not_wait_never_gets_the_row_of_nulls(uncapped: Store, dsn: str) -> None:
    """The same held queue as above under a policy on claim_fair that does not wait: its claim
    is the first statement alone, and the row of NULLs that asks for the second is not a job."""
    import psycopg

    from fairq.policies.base import Policy

    ids = fill(uncapped, {"a": 1})
    fill(uncapped, {"b": 3})
    sent = _counting(uncapped)
    nowait = Policy("weighted_nowait", "claim_fair", params=get_policy("weighted").params)
    with psycopg.connect(dsn) as job_holder, psycopg.connect(dsn) as row_holder:
        job_holder.execute("SELECT 1 FROM fairq.jobs WHERE id = %s FOR UPDATE", (ids[0],))
        row_holder.execute("SELECT 1 FROM fairq.tenant_schedule WHERE tenant = 'b' "
                           "FOR NO KEY UPDATE")
        assert uncapped.claim(nowait, queue="default", batch=10, worker="w") == []
    assert sent == [False]


@pytest.mark.parametrize("policy", FAIR)
def test_a_full_claim_retires_the_tenants_its_walk_went_past_and_no_other(uncapped: Store,
                                                                        dsn: str,
                                                                        policy: str) -> None:
    """The walk numbers the rows it locks; a full claim whose last served tenant's number is
    past the count of tenants it served went past a locked tenant that gave nothing, and
    claim_settle retires those without a due job (the read before the stop; a claim that
    served every row it locked skips that read). A tenant another transaction holds is skipped
    by the walk and not retired: the holder decides, or the next walk that locks it. All at one
    virtual time, in name order: a0, a1 and a2 (held) active without a due job, b with jobs, c
    after the stop without one."""
    import psycopg

    fill(uncapped, {"a0": 1, "a1": 1, "a2": 1, "b": 6, "c": 1})
    sql_rows(dsn, "UPDATE fairq.jobs SET status = 'cancelled' WHERE tenant <> 'b'")
    sql_rows(dsn, "UPDATE fairq.tenant_schedule SET vtime = 0")
    active = "SELECT tenant FROM fairq.tenant_schedule WHERE active ORDER BY 1"
    holder = psycopg.connect(dsn)
    try:
        holder.execute("SELECT FROM fairq.tenant_schedule WHERE tenant = 'a2' FOR NO KEY UPDATE")
        got = uncapped.claim(get_policy(policy), queue="default", batch=2, worker="w")
        assert [j.tenant for j in got] == ["b", "b"]
        # a0 and a1 walked past and retired; b has due jobs left; c is after the stop
        assert sql_rows(dsn, active) == [("a2",), ("b",), ("c",)]
    finally:
        holder.close()
    # a2 released: the next walk locks it, finds nothing due, goes past it to b and retires it
    sql_rows(dsn, "UPDATE fairq.tenant_schedule SET vtime = 0 WHERE tenant IN ('a2', 'b')")
    sql_rows(dsn, "UPDATE fairq.tenant_schedule SET vtime = 1 WHERE tenant = 'c'")
    got = uncapped.claim(get_policy(policy), queue="default", batch=2, worker="w")
    assert [j.tenant for j in got] == ["b", "b"]
    assert sql_rows(dsn, active) == [("b",), ("c",)]


def _the_lock_waiter(dsn: str) -> int:
    """The pid of the one backend of this database waiting for a lock, once there is one."""
    deadline = time.monotonic() + 30
    while not (rows := sql_rows(dsn, "SELECT pid FROM pg_stat_activity "
                                     "WHERE datname = current_database() "
                                     "AND wait_event_type = 'Lock'")):
        assert time.monotonic() < deadline, "nothing ever waited for a lock"
        time.sleep(0.01)
    assert len(rows) == 1, rows
    return int(rows[0][0])


@pytest.mark.parametrize("policy", FAIR)
def test_a_tenant_an_open_enqueue_adds_to_is_not_retired_with_its_last_job(uncapped: Store,
                                                                           dsn: str,
                                                                           policy: str) -> None:
    """A producer's open transaction adds a job to "a", whose one committed job a claim then
    takes. The claim cannot see the new job, so "a" looks empty; retiring it now would strand
    that job once the producer commits (the producer saw "a" active and woke nobody). The
    producer holds FOR KEY SHARE on a's row, so the claim's FOR UPDATE SKIP LOCKED skips it
    and "a" stays runnable: after the commit the next claim takes the job. Without the
    producer, the same claim retires "a" in the write that serves it."""
    import psycopg

    import fairq

    fill(uncapped, {"a": 1, "b": 3})
    app = fairq.App(dsn)
    producer = psycopg.connect(dsn)
    try:
        app.enqueue("t", tenant="a", connection=producer)  # not committed yet
        got = uncapped.claim(get_policy(policy), queue="default", batch=2, worker="w")
        assert sorted(j.tenant for j in got) == ["a", "b"]
        assert sql_rows(dsn, "SELECT active FROM fairq.tenant_schedule WHERE tenant = 'a'") \
            == [(True,)]
        producer.commit()
        got = uncapped.claim(get_policy(policy), queue="default", batch=2, worker="w")
        assert sorted(j.tenant for j in got) == ["a", "b"]
    finally:
        producer.close()
        app.close()
    # No producer now: a's last job goes, and a leaves the runnable set with it.
    assert sql_rows(dsn, "SELECT active FROM fairq.tenant_schedule WHERE tenant = 'a'") \
        == [(False,)]


@pytest.mark.parametrize("policy", FAIR)
def test_the_safety_net_wakes_an_idle_tenant_with_a_due_job_and_no_wake_up(uncapped: Store,
                                                                           dsn: str,
                                                                           policy: str) -> None:
    """A tenant left idle with a due job and no wake-up (the state a lost race would leave) is
    in neither idle-tenant index, which hold only tenants with a wake_at: no claim and no
    wake_due_tenants finds it; wake_stranded_tenants, which reads the table, does, and the next
    claim takes its job."""
    fill(uncapped, {"a": 2, "b": 1})
    sql_rows(dsn, "UPDATE fairq.tenant_schedule SET active = false, wake_at = NULL "
                  "WHERE tenant = 'a'")
    got = uncapped.claim(get_policy(policy), queue="default", batch=4, worker="w")
    assert [j.tenant for j in got] == ["b"]
    assert uncapped.claim(get_policy(policy), queue="default", batch=4, worker="w") == []
    assert uncapped.wake_due_tenants() == 0
    assert uncapped.wake_stranded_tenants() == 1
    got = uncapped.claim(get_policy(policy), queue="default", batch=4, worker="w")
    assert [j.tenant for j in got] == ["a", "a"]


@pytest.mark.parametrize("policy", FAIR)
def test_the_tenant_a_full_batch_stops_at_keeps_its_lower_priority_and_later_due_jobs(
        uncapped: Store, dsn: str, policy: str) -> None:
    """The batch is cut short at "a" (the walk's stop), which is asked for a due job after the
    last one it gave, in the queue's order (priority DESC, run_at, id): runnable while it has
    one (a lower-priority due job; claim_settle also checks again before it retires a tenant);
    retired, waiting for its delayed job, once it has none: a delayed job is not due, and a
    tenant kept runnable for it would be an empty one in the walk."""
    import fairq

    app = fairq.App(dsn)
    try:
        for priority in (5, 5, 0):
            app.enqueue("t", tenant="a", priority=priority)
        app.enqueue("t", tenant="a", delay=3600)
    finally:
        app.close()
    active = "SELECT active, wake_at IS NOT NULL FROM fairq.tenant_schedule WHERE tenant = 'a'"
    got = uncapped.claim(get_policy(policy), queue="default", batch=2, worker="w")
    assert [j.priority for j in got] == [5, 5]
    assert sql_rows(dsn, active) == [(True, False)]  # the priority-0 job is due after them
    got = uncapped.claim(get_policy(policy), queue="default", batch=1, worker="w")
    assert [j.priority for j in got] == [0]
    assert sql_rows(dsn, active) == [(False, True)]  # only the delayed job is left
    assert uncapped.claim(get_policy(policy), queue="default", batch=1, worker="w") == []


@pytest.mark.parametrize("policy", FAIR)
def test_the_stop_is_asked_after_its_last_job_in_the_queues_order_not_its_highest_id(
        uncapped: Store, dsn: str, policy: str) -> None:
    """The last job a cut-short tenant gave, in the queue's order, is not its highest id when a
    later job has a higher priority: "a" has a priority-0 job, then a priority-5 one, and a
    delayed one. A claim of 2 takes both due jobs (the 5 first) and is cut short at "a"; asked
    after its highest id (the priority-5 job), "a" would look runnable (its priority-0 job is
    still queued in the claim's snapshot); asked after the priority-0 job it gave last, it has
    no due job left and is retired, waiting for its delayed job."""
    import fairq

    app = fairq.App(dsn)
    try:
        app.enqueue("t", tenant="a", priority=0)
        app.enqueue("t", tenant="a", priority=5)
        app.enqueue("t", tenant="a", delay=3600)
    finally:
        app.close()
    got = sorted(uncapped.claim(get_policy(policy), queue="default", batch=2, worker="w"),
                 key=lambda j: -j.priority)
    assert [j.priority for j in got] == [5, 0]
    assert got[0].id > got[1].id
    assert sql_rows(dsn, "SELECT active, wake_at IS NOT NULL FROM fairq.tenant_schedule "
                         "WHERE tenant = 'a'") == [(False, True)]


@pytest.mark.parametrize("policy", FAIR)
def test_a_walk_cut_short_by_the_batch_locks_only_the_jobs_it_takes(uncapped: Store, dsn: str,
                                                                   policy: str) -> None:
    """The pick of the tenant a batch stops at may give more jobs than the batch has room for
    (a window's worth, plus one); its pick reads no more than the batch has room for, and the
    check for a due job after the last one it gave locks nothing. A job read is a job locked
    (FOR UPDATE SKIP LOCKED), and a job locked but not taken is hidden from every other claim
    until this one commits."""
    import psycopg

    from fairq import sql
    from fairq.store.planner import planner_options

    fill(uncapped, {"t": 20})
    text = sql.statement(get_policy(policy).statement, "fairq")
    params = get_policy(policy).claim_params(queue="default", batch=5, worker="w")
    free = ("SELECT count(*) FROM (SELECT j.id FROM fairq.jobs j WHERE j.status = 'queued' "
            "FOR UPDATE SKIP LOCKED) x")
    with psycopg.connect(dsn, options=planner_options()) as a, \
            psycopg.connect(dsn, autocommit=True) as b:
        assert len(a.execute(text, params).fetchall()) == 5
        row = b.execute(free).fetchone()
        assert row is not None and row[0] == 15
        a.rollback()


def serve_beside_returning_tenants(store: Store, policy: str,
                                   refill: Callable[[str], None]) -> dict[str, int]:
    """100 claims of one job, each finished at once, over a backlogged tenant "zz" (its name
    sorts last) and four one-job tenants a-d, each refilled by ``refill(tenant)`` as soon as its
    job is claimed; what each tenant got. Every job ran a second, as charged (policy time): no
    correction moves anyone."""
    pol = get_policy(policy)
    fill(store, {"zz": 200})
    fill(store, {t: 1 for t in "abcd"})
    served: list[str] = []
    for _ in range(100):
        got = store.claim(pol, queue="default", batch=1, worker="w")
        assert len(got) == 1
        store.finish_done([(got[0].id, got[0].attempts)], run_seconds=[1.0])
        served.append(got[0].tenant)
        if got[0].tenant != "zz":
            refill(got[0].tenant)
    return counts(served)


@pytest.mark.parametrize("policy", [*FAIR, "time"])
def test_a_backlogged_tenant_named_last_keeps_its_share_among_tenants_that_keep_returning(
        uncapped: Store, policy: str) -> None:
    # Each one-job tenant refilled by an enqueue, which wakes it. A returning tenant keeps (up
    # to one job of) the debt of the job it just had; back at V it would tie with the
    # backlogged tenant and win on its name every time. Equal weights: a fifth each.
    served = serve_beside_returning_tenants(uncapped, policy,
                                            lambda tenant: fill(uncapped, {tenant: 1}))
    assert served == {t: 20 for t in ["a", "b", "c", "d", "zz"]}, served


@pytest.mark.parametrize("policy", [*FAIR, "time"])
def test_a_backlogged_tenant_named_last_keeps_its_share_among_sleepers_that_keep_waking(
        uncapped: Store, dsn: str, policy: str) -> None:
    # Each one-job tenant refilled by a delayed job that falls due before the next claim, which
    # wakes it as a sleeper. A sleeper that owes comes after the walk, not first.
    def refill(tenant: str) -> None:
        uncapped.enqueue([NewJob("t", tenant, "{}", delay=3600)])
        # Due now, as time would make it: the next claim wakes the tenant (step 1).
        sql_rows(dsn, "UPDATE fairq.jobs SET run_at = now() - interval '1 s' "
                      "WHERE status = 'queued' AND tenant <> 'zz';"
                      "UPDATE fairq.tenant_schedule SET wake_at = now() - interval '1 s' "
                      "WHERE NOT active")

    served = serve_beside_returning_tenants(uncapped, policy, refill)
    assert served == {t: 20 for t in ["a", "b", "c", "d", "zz"]}, served
