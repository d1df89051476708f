"""Policy time through the store: what a claim charges, what a finish corrects, and run times
at the edges (the reference model's comparison is in test_fair_stateful.py)."""

from __future__ import annotations

import pytest

from fairq.errors import InvalidInput
from fairq.models import NewJob
from fairq.policies import get_policy
from fairq.runtime import WorkerSettings
from fairq.runtime.maintenance import UsageDecay
from fairq.store import Store
from tests.support.fairtools import sql_rows

TIME = get_policy("time")


def schedule(dsn: str, tenant: str) -> tuple[float, float | None]:
    ((vtime, avg),) = sql_rows(dsn, "SELECT vtime, avg_run_s FROM fairq.tenant_schedule "
                                    "WHERE tenant = %s", (tenant,))
    return vtime, avg


def test_a_claim_charges_the_expected_run_time_and_the_finish_corrects_it(
        store: Store, dsn: str) -> None:
    store.enqueue([NewJob("t", "a", "{}"), NewJob("t", "b", "{}")] * 3)
    (job,) = store.claim(TIME, queue="default", batch=1, worker="w")
    assert sql_rows(dsn, "SELECT charged_s FROM fairq.jobs WHERE id = %s", (job.id,)) == [(1.0,)]
    before, _ = schedule(dsn, job.tenant)
    store.finish_done([(job.id, job.attempts)], run_seconds=[0.25])
    after, avg = schedule(dsn, job.tenant)
    assert (after - before, avg) == (-0.75, 0.25)   # charged 1 s (unknown), ran 0.25 s
    (job,) = store.claim(TIME, queue="default", batch=1, worker="w")
    (charged,) = sql_rows(dsn, "SELECT charged_s FROM fairq.jobs WHERE id = %s", (job.id,))[0]
    assert charged == (0.25 if job.tenant == "a" else 1.0)


def test_other_policies_charge_nothing_but_learn_the_run_time(store: Store, dsn: str) -> None:
    store.enqueue([NewJob("t", "a", "{}")] * 2)
    for policy in ("weighted", "fifo"):
        (job,) = store.claim(get_policy(policy), queue="default", batch=1, worker="w")
        assert sql_rows(dsn, "SELECT charged_s FROM fairq.jobs WHERE id = %s",
                        (job.id,)) == [(None,)]
        vtime, _ = schedule(dsn, "a")
        store.finish_done([(job.id, job.attempts)], run_seconds=[2.0])
        assert schedule(dsn, "a") == (vtime, 2.0)


@pytest.mark.parametrize("run_s", [0.0, -1.0])
def test_a_run_time_of_zero_or_less_leaves_the_claims_working(
        store: Store, dsn: str, run_s: float) -> None:
    # A job that took no measurable time (or a clock that stepped back) must not make the
    # tenant's expected run time 0: the claim divides by it.
    store.enqueue([NewJob("t", "a", "{}")] * 3)
    (job,) = store.claim(TIME, queue="default", batch=1, worker="w")
    store.finish_done([(job.id, job.attempts)], run_seconds=[run_s])
    assert schedule(dsn, "a")[1] == pytest.approx(1e-6)
    assert len(store.claim(TIME, queue="default", batch=2, worker="w")) == 2


def test_decay_halves_the_leads_over_the_queue_and_leaves_the_front(store: Store, dsn: str) -> None:
    store.enqueue([NewJob("t", t, "{}") for t in ("a", "b", "c")] * 3)
    for ran in (9.0, 5.0):   # two tenants ran longer than charged: ahead of the third
        (job,) = store.claim(TIME, queue="default", batch=1, worker="w")
        store.finish_done([(job.id, job.attempts)], run_seconds=[ran])
    ((v,),) = sql_rows(dsn, "SELECT fairq.queue_vtime('default')")
    before = dict(sql_rows(dsn, "SELECT tenant, vtime FROM fairq.tenant_schedule"))
    moved = store.decay_usage(["default"], 0.5)
    after = dict(sql_rows(dsn, "SELECT tenant, vtime FROM fairq.tenant_schedule"))
    assert moved == sum(1 for x in before.values() if x > v) > 0
    assert after == {t: (v + (x - v) * 0.5 if x > v else x) for t, x in before.items()}
    with pytest.raises(Exception, match="decay factor"):
        store.decay_usage(["default"], 1.5)


def test_the_half_life_service_decays_its_queues_by_its_interval(store: Store, dsn: str) -> None:
    store.enqueue([NewJob("t", t, "{}") for t in ("a", "b")] * 2)
    (job,) = store.claim(TIME, queue="default", batch=1, worker="w")
    store.finish_done([(job.id, job.attempts)], run_seconds=[5.0])   # 5 s ahead of the other
    lead = sql_rows(dsn, "SELECT vtime FROM fairq.tenant_schedule WHERE tenant = %s",
                    (job.tenant,))[0][0]
    assert UsageDecay(store, ["default"], half_life=4.0, interval=2.0).run_once() == 1
    after = sql_rows(dsn, "SELECT vtime FROM fairq.tenant_schedule WHERE tenant = %s",
                     (job.tenant,))[0][0]
    assert after == pytest.approx(lead * 0.5 ** 0.5)   # V is 0: half an half-life gone


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "60", True])
def test_a_bad_half_life_is_one_clear_error(bad: object) -> None:
    with pytest.raises(InvalidInput, match="time_half_life"):
        WorkerSettings(time_half_life=bad)  # type: ignore[arg-type]
