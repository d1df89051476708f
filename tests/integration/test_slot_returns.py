"""Slots given back while a tenant's row is held (slots.sql): a finish never waits for the row,
the slot waits in slot_returns until whoever holds the row next folds it in, and caps stay
exact and live: a claim that takes a tenant to its cap waits for the finishes that have not
committed and folds what they gave back.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from fairq.models import ClaimedJob, TenantConfig
from fairq.policies import get_policy
from fairq.store import Store
from tests.support.fairtools import fill, holding_row, running_mismatch, sql_rows

FAIR = ["round_robin", "weighted", "drr", "time"]


def _row(dsn: str) -> tuple[int, int, int]:
    """(the row's count, the count with unfolded slots taken off, the slots unfolded)."""
    r = sql_rows(dsn, "SELECT ts.running, fairq.tenant_running(ts), (SELECT count(*) FROM "
                      "fairq.slot_returns x WHERE x.tenant = ts.tenant) "
                      "FROM fairq.tenant_schedule ts WHERE ts.tenant = 't'")
    return r[0][0], r[0][1], r[0][2]


def _finish_in_thread(store: Store, jobs: list[ClaimedJob]) -> None:
    """Finish ``jobs``; fails if the finish waits (for the held row) more than 20 s."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            store.finish_done([(j.id, j.attempts) for j in jobs])
        except BaseException as e:  # reported below
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join(20)
    assert not t.is_alive(), "the finish waited for the tenant row another transaction holds"
    assert not errors, errors


def _waited_for(dsn: str, pid: int) -> bool:
    """Whether some backend of the database waits for ``pid``'s locks, within 30 s."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if sql_rows(dsn, "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
                         "AND %s = ANY (pg_blocking_pids(pid))", (pid,)):
            return True
        time.sleep(0.01)
    return False


def test_a_finish_does_not_wait_for_a_held_row_and_the_next_claim_folds_its_slot(
        store: Store, dsn: str) -> None:
    store.set_tenants([], defaults=(1.0, 100))
    fill(store, {"t": 5})
    got = store.claim(get_policy("weighted"), queue="default", batch=2, worker="w")
    assert len(got) == 2
    with holding_row(dsn, "t"):
        _finish_in_thread(store, got[:1])
        assert _row(dsn) == (2, 1, 1)  # the slot waits in slot_returns
        assert running_mismatch(dsn) == []
    more = store.claim(get_policy("weighted"), queue="default", batch=1, worker="w")
    assert len(more) == 1
    assert _row(dsn) == (2, 2, 0)  # folded by the claim that served t
    assert running_mismatch(dsn) == []


def test_a_claim_that_caps_a_tenant_waits_for_an_open_finish_and_folds_its_slot(
        store: Store, dsn: str) -> None:
    """The finish gave its slot back to slot_returns (the row was held) and has not
    committed; the claim then takes t to its cap (2) by its own count. It must wait for the
    finish and fold the slot: otherwise t would leave the runnable index with a slot free and
    no claim would ever serve it again."""
    store.set_tenants([TenantConfig("t", 1.0, 2)], defaults=(1.0, 100))
    fill(store, {"t": 5})
    first = store.claim(get_policy("weighted"), queue="default", batch=1, worker="w")
    assert len(first) == 1
    finisher = psycopg.connect(dsn)
    try:
        with holding_row(dsn, "t"):
            finisher.execute(store.statement("finish_done"), {
                "ids": [first[0].id], "attempts": [first[0].attempts], "results": None,
                "notes": None, "run_seconds": [0.01], "started": [first[0].started_at]})
        assert _row(dsn) == (1, 1, 0)  # the finish is not committed
        got: list[ClaimedJob] = []
        errors: list[BaseException] = []

        def claim() -> None:
            try:
                got.extend(store.claim(get_policy("weighted"), queue="default", batch=5,
                                       worker="w"))
            except BaseException as e:  # reported below
                errors.append(e)

        claimer = threading.Thread(target=claim)
        claimer.start()
        assert _waited_for(dsn, finisher.info.backend_pid), "the claim did not wait"
        finisher.commit()
        claimer.join(30)
        assert not claimer.is_alive() and not errors, errors
    finally:
        finisher.close()
    assert len(got) == 1  # room 1 by the row's count
    assert _row(dsn) == (1, 1, 0)  # the finish's slot folded: one job running, not capped
    assert running_mismatch(dsn) == []
    again = store.claim(get_policy("weighted"), queue="default", batch=5, worker="w")
    assert len(again) == 1  # t has its free slot, so a claim serves it
    assert _row(dsn) == (2, 2, 0)


def test_a_finish_does_not_wait_for_a_claim_capping_the_tenant(store: Store, dsn: str) -> None:
    """A claim that caps t holds t's row and its returns lock exclusively while it waits for
    other finishes (settle_capped). A finish of t must not wait for that lock: waiting, it
    would hold what the claim may wait for (the finish's row locks can wait a moment, decision
    018), a deadlock. It leaves its slot marked `capped`, which the next claim folds."""
    store.set_tenants([], defaults=(1.0, 100))
    fill(store, {"t": 3})
    got = store.claim(get_policy("weighted"), queue="default", batch=1, worker="w")
    assert len(got) == 1
    with psycopg.connect(dsn) as claim:
        claim.execute("SELECT 1 FROM fairq.tenant_schedule WHERE tenant = 't' "
                      "FOR NO KEY UPDATE")
        claim.execute("SELECT pg_advisory_xact_lock(1718710899, "
                      "fairq.returns_lock('default', 't'))")
        _finish_in_thread(store, got)
        assert sql_rows(dsn, "SELECT n, capped FROM fairq.slot_returns") == [(1, True)]
        claim.rollback()
    more = store.claim(get_policy("weighted"), queue="default", batch=1, worker="w")
    assert len(more) == 1
    assert _row(dsn) == (1, 1, 0)  # folded by the next claim
    assert running_mismatch(dsn) == []


@pytest.mark.parametrize("policy", [*FAIR, "fifo"])
def test_a_slot_given_back_to_a_capped_tenant_is_folded_by_the_next_claims(
        store: Store, dsn: str, policy: str) -> None:
    store.set_tenants([TenantConfig("t", 1.0, 1)], defaults=(1.0, 100))
    fill(store, {"t": 3})
    got = store.claim(get_policy(policy), queue="default", batch=5, worker="w")
    assert len(got) == 1
    with holding_row(dsn, "t"):
        _finish_in_thread(store, got)
        assert sql_rows(dsn, "SELECT capped FROM fairq.slot_returns") == [(True,)]
    # fair claims fold capped tenants' slots before their walk; fifo's at its end, so its
    # next claim serves the tenant.
    claims = [store.claim(get_policy(policy), queue="default", batch=5, worker="w")
              for _ in range(2)]
    assert [len(c) for c in claims] in ([1, 0], [0, 1])
    if policy != "fifo":
        assert len(claims[0]) == 1
    assert _row(dsn) == (1, 1, 0)
    assert running_mismatch(dsn) == []


def test_the_sweep_folds_an_idle_tenants_last_slots(store: Store, dsn: str) -> None:
    store.set_tenants([], defaults=(1.0, 100))
    fill(store, {"t": 2})
    got = store.claim(get_policy("weighted"), queue="default", batch=5, worker="w")
    assert len(got) == 2
    with holding_row(dsn, "t"):
        _finish_in_thread(store, got)
        # a sweep meanwhile skips the held row
        assert store.fold_stale_returns(0.0) == 0
    assert _row(dsn) == (2, 0, 1)
    assert store.fold_stale_returns(3600.0) == 0  # too recent
    assert store.fold_stale_returns(0.0) == 1
    assert _row(dsn) == (0, 0, 0)


def test_policy_time_corrections_given_back_reach_the_virtual_time(store: Store,
                                                                  dsn: str) -> None:
    """The correction of a charge (time run - time charged) waits with the slot and moves the
    tenant's virtual time when folded, as a direct write would."""
    store.set_tenants([], defaults=(1.0, 100))
    fill(store, {"t": 5})
    got = store.claim(get_policy("time"), queue="default", batch=1, worker="w")
    vtime0, avg0 = sql_rows(dsn, "SELECT vtime, avg_run_s FROM fairq.tenant_schedule")[0]
    with holding_row(dsn, "t"):
        store.finish_done([(got[0].id, got[0].attempts)], run_seconds=[3.0])
        assert sql_rows(dsn, "SELECT n, runs, run_sum FROM fairq.slot_returns") == [(1, 1, 3.0)]
    charged = sql_rows(dsn, "SELECT charged_s FROM fairq.jobs WHERE id = %s", (got[0].id,))[0][0]
    assert store.fold_stale_returns(0.0) == 1
    vtime1, avg1 = sql_rows(dsn, "SELECT vtime, avg_run_s FROM fairq.tenant_schedule")[0]
    assert vtime1 == pytest.approx(vtime0 + (3.0 - charged))
    assert avg0 is None and avg1 == pytest.approx(3.0)
