"""Policy time through the store: what a claim charges, what a finish corrects, and run times
at the edges (the reference model's comparison is in test_fair_stateful.py)."""

from __future__ import annotations

import pytest

from fairq.models import NewJob
from fairq.policies import get_policy
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
