"""Pure unit tests of the scheduling maths: the reference model and the fairness measures."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairq.errors import InvalidInput
from fairq.policies import DRR, FIFO, POLICIES, ROUND_ROBIN, WEIGHTED, get_policy
from fairq.policies.fairness import jain_index, max_share_error
from fairq.policies.model import ModelJob, QueueModel


def backlog(model: QueueModel, tenants: dict[str, int], *, weights: dict[str, float] | None = None,
            cost: dict[str, float] | None = None, start_id: int = 1) -> int:
    """Enqueue `count` jobs per tenant, interleaved in id order like a real mixed arrival."""
    next_id = start_id
    for i in range(max(tenants.values())):
        for t, count in tenants.items():
            if i < count:
                model.enqueue(ModelJob(next_id, t, cost=(cost or {}).get(t, 1.0)), now=0.0,
                              weight=(weights or {}).get(t, 1.0), max_running=10**6)
                next_id += 1
    return next_id


def drain(model: QueueModel, policy_name: str, claims: int, batch: int = 1) -> list[str]:
    """Claim and immediately finish; returns the tenant of every claimed job in order."""
    order: list[str] = []
    for _ in range(claims):
        ids = model.claim(POLICIES[policy_name], batch, now=1.0)
        for i in ids:
            order.append(model.running[i].tenant)
            model.finish(i)
    return order


def test_get_policy_rejects_unknown_names_with_the_valid_ones() -> None:
    with pytest.raises(InvalidInput, match="drr, fifo, round_robin, weighted"):
        get_policy("lottery")
    assert get_policy("weighted") is WEIGHTED


def test_increments_per_policy() -> None:
    assert FIFO.increment(cost=5, weight=2) == 0
    assert ROUND_ROBIN.increment(cost=5, weight=2) == 1
    assert WEIGHTED.increment(cost=5, weight=2) == 0.5
    assert DRR.increment(cost=5, weight=2) == 2.5


def test_jain_index_bounds() -> None:
    assert jain_index([3, 3, 3]) == pytest.approx(1.0)
    assert jain_index([9, 0, 0]) == pytest.approx(1 / 3)
    assert max_share_error({"a": 75, "b": 25}, {"a": 3, "b": 1}) == pytest.approx(0.0)
    assert max_share_error({"a": 50, "b": 50}, {"a": 3, "b": 1}) == pytest.approx(0.25)


def test_round_robin_serves_every_tenant_once_per_round() -> None:
    m = QueueModel()
    backlog(m, {"a": 10, "b": 10, "c": 10})
    order = drain(m, "round_robin", 9)
    for r in range(3):
        assert sorted(order[3 * r:3 * r + 3]) == ["a", "b", "c"]


def test_batch_takes_one_from_each_of_ten_backlogged_tenants() -> None:
    for name in ("round_robin", "weighted", "drr"):
        m = QueueModel()
        backlog(m, {f"t{i}": 5 for i in range(10)})
        assert sorted(drain(m, name, 1, batch=10)) == [f"t{i}" for i in range(10)]


def test_fifo_ignores_tenants() -> None:
    m = QueueModel()
    for i in range(1, 21):
        m.enqueue(ModelJob(i, "big"), now=0)
    m.enqueue(ModelJob(21, "small"), now=0)
    assert drain(m, "fifo", 20) == ["big"] * 20


@given(st.lists(st.sampled_from([0.5, 1.0, 2.0, 4.0]), min_size=2, max_size=6), st.integers(1, 10))
@settings(max_examples=60, deadline=None)
def test_weighted_shares_converge_to_weights(weights: list[float], batch: int) -> None:
    m = QueueModel()
    names = {f"t{i}": w for i, w in enumerate(weights)}
    for t, w in names.items():
        m.set_tenant(t, w, 10**6)
    backlog(m, {t: 1000 for t in names}, weights=names)
    order = drain(m, "weighted", 1000 // batch, batch=batch)
    served = {t: order.count(t) for t in names}
    assert max_share_error(served, names) < 0.02


def test_drr_is_fair_on_cost_not_job_count() -> None:
    m = QueueModel()
    backlog(m, {"heavy": 500, "light": 5000}, cost={"heavy": 10.0, "light": 1.0})
    order = drain(m, "drr", 1100)
    heavy, light = order.count("heavy"), order.count("light")
    assert light / heavy == pytest.approx(10, rel=0.05)


def test_idle_tenant_banks_no_credit() -> None:
    m = QueueModel()
    backlog(m, {"busy": 2000})
    drain(m, "weighted", 1000)            # busy alone: its vtime is now 1000
    backlog(m, {"late": 500}, start_id=10_000)
    order = drain(m, "weighted", 100)
    assert 45 <= order.count("late") <= 55  # a fair half, not 100 claims of catch-up


def test_new_tenant_served_within_one_round() -> None:
    m = QueueModel()
    backlog(m, {f"t{i}": 100 for i in range(20)})
    drain(m, "round_robin", 7)
    backlog(m, {"new": 3}, start_id=10_000)
    order = drain(m, "round_robin", 21)
    assert order.index("new") < 21


def test_cap_limits_claims_and_zero_pauses() -> None:
    m = QueueModel()
    backlog(m, {"a": 50, "b": 50})
    m.set_tenant("a", 1.0, 3)
    m.set_tenant("b", 1.0, 0)
    ids = m.claim(WEIGHTED, 10, now=1.0)
    assert len(ids) == 3 and {m.running[i].tenant for i in ids} == {"a"}
    assert m.claim(WEIGHTED, 10, now=1.0) == []


def test_delayed_jobs_do_not_block_and_wake_on_time() -> None:
    m = QueueModel()
    m.enqueue(ModelJob(1, "a", run_at=100.0), now=0.0)
    m.enqueue(ModelJob(2, "a", run_at=0.0), now=0.0)
    assert m.claim(ROUND_ROBIN, 5, now=1.0) == [2]
    assert m.claim(ROUND_ROBIN, 5, now=1.0) == []
    assert not m.tenants["a"].active and m.tenants["a"].wake_at == 100.0
    m.wake_due(now=100.0)
    assert m.claim(ROUND_ROBIN, 5, now=100.0) == [1]


def test_ceil_share_never_zero() -> None:
    # A tenant with a tiny weight among heavy ones still gets a slot in the batch maths.
    assert math.ceil(10 * 0.001 / 1000.001) >= 1


def test_idle_queue_starts_afresh() -> None:
    m = QueueModel()
    backlog(m, {"veteran": 300})
    drain(m, "weighted", 300)                     # veteran's vtime is 300, then it goes idle
    drain(m, "weighted", 1)
    assert not m.tenants["veteran"].active
    backlog(m, {"veteran": 100, "newcomer": 100}, start_id=10_000)
    order = drain(m, "weighted", 40)
    assert order.count("newcomer") == 20
