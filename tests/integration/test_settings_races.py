"""Operators and producers at the same moment (decision 020): two operators' changes of
different fields both stay; a cap set during a tenant's first enqueue reaches its schedule row;
a delete racing an enqueue never leaves a job without a schedule row. Each race is run many
rounds with several Apps released by a barrier, and counted in the database."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import fairq
from fairq.errors import InvalidInput
from fairq.policies import get_policy

ROUNDS = 100


@pytest.fixture
def apps(dsn: str) -> Iterator[tuple[fairq.App, fairq.App]]:
    a, b = fairq.App(dsn), fairq.App(dsn)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def both(first: Any, second: Any) -> list[BaseException]:
    """Run the two callables at the same moment (a barrier); the exceptions they raised."""
    gate = threading.Barrier(2)
    errors: list[BaseException] = []

    def run(f: Any) -> None:
        gate.wait()
        try:
            f()
        except Exception as e:  # the test asserts on them
            errors.append(e)

    threads = [threading.Thread(target=run, args=(f,)) for f in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return errors


def test_two_operators_changing_different_fields_both_stay(
        dsn: str, apps: tuple[fairq.App, fairq.App]) -> None:
    a, b = apps
    lost_weight = lost_cap = 0
    for i in range(ROUNDS):
        tenant = f"t{i}"
        a.tenants.set(tenant, weight=1, max_running=1)
        w, m = 2.0 + i % 7, 3 + i % 5
        assert both(lambda t=tenant, w=w: a.tenants.set(t, weight=w),
                    lambda t=tenant, m=m: b.tenants.set(t, max_running=m)) == []
        got = a.tenants.get(tenant)
        lost_weight += got.weight != w
        lost_cap += got.max_running != m
    assert (lost_weight, lost_cap) == (0, 0)
    # The schedule rows follow too (none exist yet: no job); and what the database holds.
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT count(*) FROM fairq.tenants WHERE weight = 1 "
                            "OR max_running = 1").fetchone()
    assert rows == (0,)


def schedule_caps(dsn: str, tenants: list[str]) -> dict[str, tuple[int, int]]:
    """tenant -> (the schedule row's cap, the settings' cap)."""
    with psycopg.connect(dsn) as conn:
        return {r[0]: (r[1], r[2]) for r in conn.execute(
            "SELECT s.tenant, s.max_running, t.max_running FROM fairq.tenant_schedule s "
            "JOIN fairq.tenants t USING (tenant) WHERE s.tenant = ANY(%s)", (tenants,))}


def test_a_cap_set_during_a_first_enqueue_reaches_the_engine(
        dsn: str, apps: tuple[fairq.App, fairq.App]) -> None:
    """Deterministic: the enqueue's transaction is open when the cap is set."""
    a, b = apps
    done = threading.Event()
    with psycopg.connect(dsn) as conn:
        a.enqueue("t.x", tenant="fresh", connection=conn)
        setter = threading.Thread(target=lambda: (b.tenants.set("fresh", max_running=1),
                                                  done.set()))
        setter.start()
        done.wait(1.0)  # today it waits for this commit; the check below holds either way
        conn.commit()
    setter.join(30)
    assert done.is_set()
    assert schedule_caps(dsn, ["fresh"]) == {"fresh": (1, 1)}
    # And the claim honours it: five more jobs, a claim of eight takes one.
    for _ in range(5):
        a.enqueue("t.x", tenant="fresh")
    got = a.store.claim(get_policy("weighted"), queue="default", batch=8, worker="w")
    assert len(got) == 1
    assert a.store.claim(get_policy("weighted"), queue="default", batch=8, worker="w") == []


def test_caps_set_while_new_tenants_enqueue_all_reach_the_engine(
        dsn: str, apps: tuple[fairq.App, fairq.App]) -> None:
    a, b = apps
    tenants = [f"new{i}" for i in range(ROUNDS * 2)]
    for tenant in tenants:
        assert both(lambda t=tenant: a.enqueue("t.x", tenant=t),
                    lambda t=tenant: b.tenants.set(t, max_running=1)) == []
    caps = schedule_caps(dsn, tenants)
    assert len(caps) == len(tenants)
    assert {t: c for t, c in caps.items() if c != (1, 1)} == {}


def stranded(dsn: str) -> int:
    """Queued jobs whose (queue, tenant) has no schedule row: no claim can find them."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM fairq.jobs j WHERE j.status = 'queued' AND NOT EXISTS "
            "(SELECT FROM fairq.tenant_schedule s WHERE s.queue = j.queue "
            "AND s.tenant = j.tenant)").fetchone()
    assert row is not None
    return int(row[0])


def test_a_delete_racing_an_enqueue_never_strands_the_job(
        dsn: str, apps: tuple[fairq.App, fairq.App]) -> None:
    a, b = apps
    refused = deleted = 0
    for i in range(ROUNDS + 20):
        tenant = queue = f"d{i}"  # a queue of its own: the set-up's claim takes its job
        a.tenants.set(tenant, weight=2)
        job = a.enqueue("t.x", tenant=tenant, queue=queue)
        (got,) = a.store.claim(get_policy("weighted"), queue=queue, batch=1, worker="w")
        assert got.id == job
        a.store.finish_done([(job, 1)])  # the tenant has a schedule row and no job
        # The enqueue starts 0-20 ms after the delete, another offset each round: their
        # statements overlap in every order, not only in the likeliest one.
        lag = (i % 40) * 0.0005
        errors = both(lambda t=tenant, s=lag: (time.sleep(s), a.enqueue("t.x", tenant=t,
                                                                        queue=t)),
                      lambda t=tenant: b.tenants.delete(t))
        assert all(isinstance(e, InvalidInput) for e in errors), errors
        refused += len(errors)
        deleted += not errors
    assert stranded(dsn) == 0
    # Every queued job can be claimed: one per tenant, the whole set.
    claimed = 0
    for i in range(ROUNDS + 20):
        for j in a.store.claim(get_policy("weighted"), queue=f"d{i}", batch=5, worker="w"):
            claimed += 1
            a.store.finish_done([(j.id, j.attempts)])
    assert claimed == ROUNDS + 20
    assert refused + deleted == ROUNDS + 20
    assert refused and deleted  # both orders happened


def test_the_maintenance_makes_a_missing_schedule_row_and_says_so(
        dsn: str, apps: tuple[fairq.App, fairq.App], caplog: pytest.LogCaptureFixture) -> None:
    """Belt and braces: a queued job whose row is gone (however it went) is found by the
    maintenance's check, its row made from its tenant's settings, and one line logged."""
    from datetime import UTC, datetime, timedelta

    from fairq.runtime.maintenance import ScheduleRepair

    a, _ = apps
    a.tenants.set("lost", max_running=2)
    due = a.enqueue("t.x", tenant="lost")
    later = a.enqueue("t.x", tenant="later", queue="q2",
                      run_at=datetime.now(UTC) + timedelta(hours=1))
    with psycopg.connect(dsn) as conn:
        conn.execute("DELETE FROM fairq.tenant_schedule")
    assert stranded(dsn) == 2
    waker = ScheduleRepair(a.store)
    with caplog.at_level("WARNING", logger="fairq.maintenance"):
        assert waker.run_once() == 2
    assert stranded(dsn) == 0
    lines = [r.getMessage() for r in caplog.records if "schedule row" in r.getMessage()]
    assert len(lines) == 1 and "default/lost" in lines[0] and "q2/later" in lines[0]
    with psycopg.connect(dsn) as conn:
        rows = dict(conn.execute("SELECT tenant, (max_running, active, wake_at IS NOT NULL) "
                                 "FROM fairq.tenant_schedule").fetchall())
    assert rows == {"lost": ("2", "t", "f"), "later": ("10", "f", "t")}
    got = a.store.claim(get_policy("weighted"), queue="default", batch=8, worker="w")
    assert [j.id for j in got] == [due]
    assert later not in [j.id for j in got]
    assert waker.run_once() == 0  # nothing more to repair


def test_two_people_saving_over_one_version_one_wins_the_other_is_told(
        dsn: str, apps: tuple[fairq.App, fairq.App]) -> None:
    """Optimistic edits: both forms showed version N; exactly one save lands, the other is
    refused with one line and changes nothing, in every round."""
    a, b = apps
    assert a.tenants.get("nobody").version == 0
    with pytest.raises(InvalidInput, match="changed meanwhile by another operator"):
        a.tenants.set("nobody", weight=2, expected_version=3)
    assert a.tenants.get("nobody").configured is False
    first = a.tenants.set("shared", weight=1, expected_version=0)  # no settings yet: 0
    assert first.version == 1
    for i in range(ROUNDS // 2):
        shown = a.tenants.get("shared").version
        w, m = 2 + i % 3, 1 + i % 4
        errors = both(lambda v=shown, w=w: a.tenants.set("shared", weight=w, expected_version=v),
                      lambda v=shown, m=m: b.tenants.set("shared", max_running=m,
                                                         expected_version=v))
        assert len(errors) == 1 and isinstance(errors[0], InvalidInput), errors
        message = str(errors[0])
        assert "\n" not in message and message.endswith("reload")
        assert a.tenants.get("shared").version == shown + 1
    # A change from any writer counts, a 0.1.0 operator's plain UPDATE included.
    with psycopg.connect(dsn) as conn:
        conn.execute("UPDATE fairq.tenants SET weight = 7 WHERE tenant = 'shared'")
    assert a.tenants.get("shared").version == 1 + ROUNDS // 2 + 1
    with pytest.raises(InvalidInput):
        a.tenants.set("shared", weight=8, expected_version=1 + ROUNDS // 2)
    assert a.tenants.get("shared").weight == 7
