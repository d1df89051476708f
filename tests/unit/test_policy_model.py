"""Pure unit tests of the scheduling maths (no database): the reference model and the fairness
measures. Each test checks a property that follows from the algorithm's definition (see
``tests/support/policy_model.py``), not the model's own arithmetic on constants."""

from __future__ import annotations

import copy
import math
from collections import Counter

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from fairq.errors import InvalidInput
from fairq.policies import get_policy
from fairq.policies.fairness import jain_index, max_share_error
from tests.support.policy_model import ModelJob, ModelTenant, QueueModel

FAIR = ["round_robin", "weighted", "drr"]
UNCAPPED = 10**6


def configure(model: QueueModel, weights: dict[str, float], cap: int = UNCAPPED) -> None:
    for tenant, weight in weights.items():
        model.set_tenant(tenant, weight, cap)


def backlog(model: QueueModel, counts: dict[str, int], *, cost: dict[str, float] | None = None,
            start_id: int = 1, now: float = 0.0) -> int:
    """Enqueue ``count`` due jobs per tenant in one step, interleaved in id order like a mixed
    arrival; returns the next free id."""
    jobs: list[ModelJob] = []
    for i in range(max(counts.values())):
        for tenant, count in counts.items():
            if i < count:
                jobs.append(ModelJob(start_id + len(jobs), tenant, run_at=now,
                                     cost=(cost or {}).get(tenant, 1.0)))
    model.enqueue_many(jobs, now=now)
    return start_id + len(jobs)


def drain(model: QueueModel, policy: str, claims: int, batch: int = 1, now: float = 1.0) -> list[str]:
    """Claim ``claims`` times, finishing every job at once; the tenant of each claimed job."""
    order: list[str] = []
    for _ in range(claims):
        for job_id in model.claim(get_policy(policy), batch, now=now):
            order.append(model.running[job_id].tenant)
            model.finish(job_id)
    return order


# -- the policy registry and the fairness measures --------------------------------------------

def test_get_policy_rejects_unknown_names_with_the_valid_ones() -> None:
    with pytest.raises(InvalidInput, match="drr, fifo, round_robin, time, weighted"):
        get_policy("lottery")
    assert get_policy("weighted").name == "weighted"


def test_the_model_reads_each_policys_parameters() -> None:
    assert dict(get_policy("round_robin").params) == {"by_weight": False, "by_cost": False,
                                                      "by_time": False}
    assert dict(get_policy("weighted").params) == {"by_weight": True, "by_cost": False,
                                                   "by_time": False}
    assert dict(get_policy("drr").params) == {"by_weight": True, "by_cost": True, "by_time": False}
    assert dict(get_policy("time").params) == {"by_weight": True, "by_cost": False, "by_time": True}
    assert "by_weight" not in dict(get_policy("fifo").params)


def test_jain_index_and_share_error() -> None:
    assert jain_index([3, 3, 3]) == pytest.approx(1.0)
    assert jain_index([9, 0, 0]) == pytest.approx(1 / 3)
    assert max_share_error({"a": 75, "b": 25}, {"a": 3, "b": 1}) == pytest.approx(0.0)
    assert max_share_error({"a": 50, "b": 50}, {"a": 3, "b": 1}) == pytest.approx(0.25)


# -- V, activation, deactivation -------------------------------------------------------------

def test_activation_vtime_is_runnable_min_else_active_max_else_zero() -> None:
    m = QueueModel()
    assert m.activation_vtime() == 0.0
    m.tenants = {
        "a": ModelTenant("a", vtime=5.0),
        "b": ModelTenant("b", vtime=3.0),
        "capped": ModelTenant("capped", vtime=1.0, max_running=2, running=2),
        "idle": ModelTenant("idle", vtime=0.5, active=False),
    }
    assert m.activation_vtime() == 3.0            # capped and idle tenants do not count
    m.tenants["a"].running = m.tenants["b"].running = 10
    assert m.activation_vtime() == 5.0            # all active ones capped: their maximum
    for t in ("a", "b", "capped"):
        m.tenants[t].active = False
    assert m.activation_vtime() == 0.0            # none active


def woken_at(t: ModelTenant, v: float) -> float:
    """Where an idle tenant comes back (docs/algorithm.md): at V, or behind it by the debt it
    left with, at most one job at its weight (1 / weight) or at weight 1, whichever is more."""
    if t.vtime <= v:
        return v
    return min(t.vtime, v + max(1.0, 1.0 / t.weight))


tenant_states = st.builds(
    lambda name, vtime, active, running, cap: ModelTenant(name, vtime=vtime, active=active,
                                                          running=running, max_running=cap),
    st.sampled_from("abc"), st.sampled_from([0.0, 1.5, 4.0, 9.0]), st.booleans(),
    st.integers(0, 3), st.integers(0, 3))


@given(st.lists(tenant_states, max_size=3, unique_by=lambda t: t.name),
       st.lists(st.tuples(st.sampled_from("abcde"), st.sampled_from([0.0, 2.0])), min_size=1, max_size=8))
def test_one_enqueue_of_many_jobs_equals_enqueueing_them_one_by_one(
        tenants: list[ModelTenant], arrivals: list[tuple[str, float]]) -> None:
    # A tenant woken with a debt moves V only when none was runnable (it becomes the front, or
    # the last capped one): then an enqueue of many is one step, and one by one differs.
    assume(any(t.active and t.running < t.max_running for t in tenants))
    jobs = [(i, tenant, delay) for i, (tenant, delay) in enumerate(arrivals, start=1)]
    at_once, one_by_one = QueueModel(), QueueModel()
    for m in (at_once, one_by_one):
        m.tenants = {t.name: copy.copy(t) for t in tenants}
    at_once.enqueue_many([ModelJob(i, t, run_at=d) for i, t, d in jobs], now=0.0)
    for i, t, d in jobs:
        one_by_one.enqueue(ModelJob(i, t, run_at=d), now=0.0)
    assert at_once.tenants == one_by_one.tenants


def test_new_tenant_starts_at_v_and_is_served_within_one_round() -> None:
    m = QueueModel()
    configure(m, {f"t{i:02}": 1.0 for i in range(20)})
    backlog(m, {f"t{i:02}": 100 for i in range(20)})
    drain(m, "round_robin", 7)
    v = m.activation_vtime()
    backlog(m, {"zz_new": 3}, start_id=10_000)     # sorts after every other tenant on a tie
    assert m.tenants["zz_new"].vtime == v
    order = drain(m, "round_robin", 20)
    assert "zz_new" in order


def test_tenant_whose_last_due_job_is_taken_is_inactive_after_that_claim() -> None:
    m = QueueModel()
    m.enqueue(ModelJob(1, "a", run_at=0.0), now=0.0)
    m.enqueue(ModelJob(2, "a", run_at=50.0), now=0.0)   # delayed
    m.enqueue(ModelJob(3, "b", run_at=0.0), now=0.0)
    m.enqueue(ModelJob(4, "b", run_at=0.0), now=0.0)
    assert m.claim(get_policy("weighted"), 3, now=1.0) == [1, 3, 4]
    assert not m.tenants["a"].active and m.tenants["a"].wake_at == 50.0
    assert not m.tenants["b"].active and m.tenants["b"].wake_at is None


def test_tenant_with_due_jobs_left_stays_active() -> None:
    m = QueueModel()
    backlog(m, {"a": 5})
    assert len(m.claim(get_policy("weighted"), 3, now=1.0)) == 3
    assert m.tenants["a"].active


def test_delayed_jobs_do_not_block_and_the_claim_wakes_them_on_time() -> None:
    m = QueueModel()
    rr = get_policy("round_robin")
    m.enqueue(ModelJob(1, "a", run_at=100.0), now=0.0)
    m.enqueue(ModelJob(2, "a", run_at=0.0), now=0.0)
    assert m.claim(rr, 5, now=1.0) == [2]
    assert m.claim(rr, 5, now=99.0) == []
    assert m.claim(rr, 5, now=100.0) == [1]         # no separate wake needed


def test_wake_due_activates_at_v_computed_before_waking() -> None:
    m = QueueModel()
    backlog(m, {"busy": 100})
    m.enqueue(ModelJob(1000, "late", run_at=10.0), now=0.0)
    m.enqueue(ModelJob(1001, "later", run_at=20.0), now=0.0)
    drain(m, "weighted", 30)
    v = m.activation_vtime()
    assert v == 30.0
    assert m.wake_due(now=9.0) == 0
    assert m.wake_due(now=20.0) == 2
    assert m.tenants["late"].vtime == m.tenants["later"].vtime == v


def test_idle_tenant_banks_no_credit() -> None:
    m = QueueModel()
    backlog(m, {"busy": 2000, "brief": 10})
    drain(m, "weighted", 200)                       # brief drained at vtime ~10, busy at ~190
    assert not m.tenants["brief"].active
    v = m.activation_vtime()
    backlog(m, {"brief": 500}, start_id=10_000)
    assert m.tenants["brief"].vtime == v > 100
    order = drain(m, "weighted", 100)
    assert abs(order.count("brief") - 50) <= 1      # a fair half, not 180 claims of catch-up


def test_idle_queue_starts_afresh() -> None:
    m = QueueModel()
    backlog(m, {"veteran": 300})
    drain(m, "weighted", 301)                       # veteran's vtime is 300 and it goes idle
    assert not m.tenants["veteran"].active
    backlog(m, {"veteran": 100, "newcomer": 100}, start_id=10_000)
    # V is 0 again; the veteran keeps one job of its debt, not the 300 of another busy period.
    assert (m.tenants["veteran"].vtime, m.tenants["newcomer"].vtime) == (1.0, 0.0)
    order = drain(m, "weighted", 40)
    assert order.count("newcomer") == 21            # a half each, and that one job


def test_retry_sets_an_inactive_tenants_wake_at_and_runs_when_due() -> None:
    m = QueueModel()
    m.enqueue(ModelJob(1, "a"), now=0.0)
    assert m.claim(get_policy("drr"), 1, now=0.0) == [1]
    assert not m.tenants["a"].active and m.tenants["a"].wake_at is None
    m.retry(1, run_at=30.0)
    assert m.tenants["a"].running == 0 and m.tenants["a"].wake_at == 30.0
    assert m.claim(get_policy("drr"), 1, now=29.0) == []
    assert m.claim(get_policy("drr"), 1, now=30.0) == [1]


def test_released_job_reactivates_its_tenant_at_v() -> None:
    m = QueueModel()
    backlog(m, {"a": 1, "b": 100})
    first = m.claim(get_policy("weighted"), 2, now=0.0)
    a_job = next(i for i in first if m.running[i].tenant == "a")
    drain(m, "weighted", 20, now=0.0)
    assert not m.tenants["a"].active
    v = m.activation_vtime()
    m.release(a_job)
    assert m.tenants["a"].active and m.tenants["a"].vtime == v and m.tenants["a"].running == 0
    assert a_job in m.claim(get_policy("weighted"), 1, now=0.0)


def test_reconfiguration_takes_effect_at_once_and_moves_nothing_else() -> None:
    m = QueueModel()
    m.set_tenant("a", 3.0, 4)                       # before a's first job: used when it appears
    backlog(m, {"a": 100, "b": 100})
    assert (m.tenants["a"].weight, m.tenants["a"].max_running) == (3.0, 4)
    drain(m, "weighted", 5, batch=4)
    before = {t.name: (t.vtime, t.running, t.active) for t in m.tenants.values()}
    m.set_tenant("b", 1.0, 0)
    assert {t.name: (t.vtime, t.running, t.active) for t in m.tenants.values()} == before
    assert {m.running[i].tenant for i in m.claim(get_policy("weighted"), 10, now=1.0)} == {"a"}


# -- one claim ------------------------------------------------------------------------------------

def test_a_claim_takes_the_first_tenants_jobs_then_walks_on_when_they_run_out() -> None:
    # Three equal tenants with three jobs each, batch 5: no share of the batch per tenant, so
    # "a" gives all three of its jobs and "b" the two the batch still has room for.
    m = QueueModel()
    for i, t in enumerate("cab" * 3, start=1):
        m.enqueue(ModelJob(i, t), now=0.0)
    ids = m.claim(get_policy("round_robin"), 5, now=0.0)
    assert [m.running[i].tenant for i in ids] == ["a", "a", "a", "b", "b"]  # (vtime, name) order
    assert ids == [2, 5, 8, 3, 6]                                          # each tenant's in id order


def test_a_tenant_gives_only_the_jobs_that_start_within_the_window() -> None:
    # Batch 5, so the window ends at hi = 0 + 5: "z" (vtime 0) gives its one job; "a" (vtime 3)
    # gives the jobs starting at 3, 4 and 5, not a fourth at 6, though the batch has room; "b"
    # (3.5) fills the batch.
    m = QueueModel()
    backlog(m, {"z": 1, "a": 10, "b": 10})
    m.tenants["a"].vtime, m.tenants["b"].vtime = 3.0, 3.5
    ids = m.claim(get_policy("round_robin"), 5, now=1.0)
    assert [m.running[i].tenant for i in ids] == ["z", "a", "a", "a", "b"]


def test_weights_set_the_shares_over_claims() -> None:
    # 3:1, batch 4: "a" is served three claims in four (4 jobs add 4/3 to its vtime, 4 to b's).
    m = QueueModel()
    configure(m, {"a": 3.0, "b": 1.0})
    backlog(m, {"a": 100, "b": 100})
    counts = Counter(drain(m, "weighted", 8, batch=4))
    assert counts == {"a": 24, "b": 8}


def test_a_tenant_with_a_tiny_weight_gets_one_job_per_turn_not_a_burst() -> None:
    # Its one job adds 1,000 to its vtime: the heavy tenants are served ~10^6 jobs before its
    # next turn, and it never takes a batch of 10 (10,000 of virtual time) at once.
    m = QueueModel()
    configure(m, {"heavy1": 1000.0, "heavy2": 1000.0, "tiny": 0.001})
    backlog(m, {"heavy1": 100, "heavy2": 100, "tiny": 5})
    order = drain(m, "weighted", 12, batch=10)
    assert order[20:21] == ["tiny"] and order.count("tiny") == 1



def test_jobs_of_a_tenant_go_by_priority_then_run_at_then_id() -> None:
    m = QueueModel()
    m.enqueue(ModelJob(1, "a", priority=0, run_at=0.0), now=5.0)
    m.enqueue(ModelJob(2, "a", priority=1, run_at=3.0), now=5.0)
    m.enqueue(ModelJob(3, "a", priority=0, run_at=-1.0), now=5.0)
    m.enqueue(ModelJob(4, "a", priority=1, run_at=3.0), now=5.0)
    m.enqueue(ModelJob(5, "a", priority=9, run_at=6.0), now=5.0)   # not due: never blocks
    assert m.claim(get_policy("round_robin"), 10, now=5.0) == [2, 4, 3, 1]


def test_cap_limits_claims_and_zero_pauses() -> None:
    m = QueueModel()
    backlog(m, {"a": 50, "b": 50})
    m.set_tenant("a", 1.0, 3)
    m.set_tenant("b", 1.0, 0)
    ids = m.claim(get_policy("weighted"), 10, now=1.0)
    assert len(ids) == 3 and {m.running[i].tenant for i in ids} == {"a"}
    assert m.claim(get_policy("weighted"), 10, now=1.0) == []
    m.finish(ids[0])
    assert len(m.claim(get_policy("weighted"), 10, now=1.0)) == 1


def test_fifo_takes_the_global_order_and_grants_each_tenant_its_free_slots() -> None:
    """The first five due jobs in global order are 22, 1, 2, 3, 4; big has three free slots, so
    job 4 stays queued and the claim returns four (the next claim serves small's job 21)."""
    m = QueueModel()
    m.set_tenant("big", 1.0, 3)
    for i in range(1, 21):
        m.enqueue(ModelJob(i, "big"), now=0.0)
    m.enqueue(ModelJob(21, "small"), now=0.0)
    m.enqueue(ModelJob(22, "small", priority=1), now=0.0)
    assert m.claim(get_policy("fifo"), 5, now=0.0) == [22, 1, 2, 3]
    assert m.claim(get_policy("fifo"), 5, now=0.0) == [21]


def test_fifo_ignores_tenants() -> None:
    m = QueueModel()
    for i in range(1, 21):
        m.enqueue(ModelJob(i, "big"), now=0.0)
    m.enqueue(ModelJob(21, "small"), now=0.0)
    assert drain(m, "fifo", 20) == ["big"] * 20


# -- long-run shares ------------------------------------------------------------------------------

def test_weights_3_to_1_give_75_percent() -> None:
    m = QueueModel()
    configure(m, {"a": 3.0, "b": 1.0})
    backlog(m, {"a": 10_000, "b": 10_000})
    order = drain(m, "weighted", 1000, batch=10)
    assert len(order) == 10_000
    assert order.count("a") / len(order) == pytest.approx(0.75, abs=0.02)


def test_round_robin_ignores_weights_and_keeps_counts_level() -> None:
    m = QueueModel()
    configure(m, {"a": 1.0, "b": 2.0, "c": 4.0})
    backlog(m, {"a": 1000, "b": 1000, "c": 1000})
    counts = Counter(drain(m, "round_robin", 300, batch=7))
    assert sum(counts.values()) == 2100
    assert max(counts.values()) - min(counts.values()) <= math.ceil(7 / 3)


@given(st.integers(2, 8), st.integers(1, 10), st.integers(1, 60))
@settings(max_examples=40, deadline=None)
def test_round_robin_counts_never_differ_by_more_than_a_batch(tenants: int, batch: int,
                                                                claims: int) -> None:
    m = QueueModel()
    names = [f"t{i}" for i in range(tenants)]
    configure(m, dict.fromkeys(names, 1.0))
    backlog(m, dict.fromkeys(names, claims * batch))
    counts = Counter(dict.fromkeys(names, 0))
    for _ in range(claims):
        counts.update(drain(m, "round_robin", 1, batch=batch))
        assert max(counts.values()) - min(counts.values()) <= batch


@pytest.mark.parametrize(("batch", "light_tenants"), [(1, 1), (10, 19)])
def test_drr_is_fair_on_cost_not_job_count(batch: int, light_tenants: int) -> None:
    # Equal weights; "heavy"'s jobs cost 10x: it gets a tenth of the jobs each light tenant gets.
    m = QueueModel()
    lights = {f"light{i:02}": 1500 for i in range(light_tenants)}
    backlog(m, {"heavy": 500, **lights}, cost={"heavy": 10.0})
    counts = Counter(drain(m, "drr", 1100 if batch == 1 else 500, batch=batch))
    light = sum(counts[t] for t in lights) / light_tenants
    assert light / counts["heavy"] == pytest.approx(10, rel=0.1)


def test_drr_is_fair_on_cost_when_a_claim_reaches_every_tenant() -> None:
    m = QueueModel()
    backlog(m, {"heavy": 500, "light": 5000}, cost={"heavy": 10.0})
    counts = Counter(drain(m, "drr", 100, batch=10))
    assert counts["light"] / counts["heavy"] == pytest.approx(10, rel=0.1)


@given(st.lists(st.sampled_from([0.5, 1.0, 2.0, 4.0]), min_size=2, max_size=6), st.integers(1, 10))
@settings(max_examples=20, deadline=None)
def test_weighted_shares_converge_to_weights(weights: list[float], batch: int) -> None:
    m = QueueModel()
    names = {f"t{i}": w for i, w in enumerate(weights)}
    configure(m, names)
    backlog(m, dict.fromkeys(names, 1000))
    order = drain(m, "weighted", 1000 // batch, batch=batch)
    assert max_share_error(Counter(order), names) < 0.02


@given(st.lists(st.tuples(st.sampled_from([0.5, 1.0, 2.0, 4.0]),
                          st.sampled_from([0.004, 0.01, 0.04, 0.3])), min_size=2, max_size=5),
       st.integers(1, 8), st.integers(1, 4))
@settings(max_examples=30, deadline=None)
def test_time_shares_worker_time_by_weight_within_the_bound(
        tenants: list[tuple[float, float]], batch: int, slots: int) -> None:
    """Policy time over tenants whose jobs run different times: ``slots`` jobs in flight, the
    oldest finishing first with its run time. Each tenant's worker time per weight stays within
    the documented bound of every other's (docs/algorithm.md, "Policy time")."""
    m = QueueModel()
    names = {f"t{i}": (w, r) for i, (w, r) in enumerate(tenants)}
    configure(m, {t: w for t, (w, _) in names.items()})
    backlog(m, dict.fromkeys(names, 4000))
    used = dict.fromkeys(names, 0.0)
    in_flight: list[int] = []
    for _ in range(600):
        in_flight += m.claim(get_policy("time"), min(batch, slots - len(in_flight)), now=1.0)
        job_id = in_flight.pop(0)
        tenant = m.running[job_id].tenant
        used[tenant] += names[tenant][1]
        m.finish(job_id, run_s=names[tenant][1])
    assert all(m.has_due(t, 1.0) for t in names)   # all backlogged throughout
    longest = max(r for _, r in names.values())
    lightest = min(w for w, _ in names.values())
    # batch * max(c) * (1 + 1 / min W) + the in-flight jobs of two tenants, each at most the
    # longest job (c is learnt: the first claims charge 1 s, corrected at their finish).
    cmax = max(1.0, longest)
    bound = batch * cmax * (1 + 1 / lightest) + 2 * slots * cmax / lightest
    per_weight = [used[t] / w for t, (w, _) in names.items()]
    assert max(per_weight) - min(per_weight) <= bound


def test_time_gives_a_long_and_a_short_tenant_equal_worker_time() -> None:
    """The runtime test's shape in the model: 40 ms and 4 ms jobs, equal weights, 4 slots."""
    m = QueueModel()
    backlog(m, {"long": 2000, "short": 20000})
    run = {"long": 0.04, "short": 0.004}
    used = {"long": 0.0, "short": 0.0}
    in_flight: list[int] = []
    for _ in range(5000):
        in_flight += m.claim(get_policy("time"), 4 - len(in_flight), now=1.0)
        job_id = in_flight.pop(0)
        tenant = m.running[job_id].tenant
        used[tenant] += run[tenant]
        m.finish(job_id, run_s=run[tenant])
    assert used["long"] / (used["long"] + used["short"]) == pytest.approx(0.5, abs=0.02)


# -- work conservation and caps -------------------------------------------------------------------

def claimable(m: QueueModel, now: float) -> bool:
    """Some due job belongs to a tenant under its cap."""
    return any(m.tenants[t].free > 0 and m.has_due(t, now) for t, jobs in m.by_tenant.items() if jobs)


@pytest.mark.parametrize("policy", FAIR)
def test_many_small_tenants_and_a_whale_drain_completely(policy: str) -> None:
    m = QueueModel()
    next_id = backlog(m, {"whale": 2000})
    backlog(m, {f"t{i:04}": 1 for i in range(5000)}, start_id=next_id)
    total = len(m.queued)
    running: list[int] = []
    claimed = 0
    for _ in range(2 * total):
        if not m.queued:
            break
        expect_work = claimable(m, 0.0)
        ids = m.claim(get_policy(policy), 10, now=0.0)
        assert ids or not expect_work               # never empty while a due job is under its cap
        served = {m.running[i].tenant for i in ids}
        assert all(m.tenants[t].running <= m.tenants[t].max_running for t in served)
        claimed += len(ids)
        running += ids
        while len(running) > 15 or (running and not ids):   # the whale (cap 10) meets its cap
            m.finish(running.pop(0))
    assert not m.queued and claimed == total
    assert not any(t.active for t in m.tenants.values())


class RandomOperations(RuleBasedStateMachine):
    """Any sequence of operations keeps the definition's invariants."""

    @initialize(policy=st.sampled_from([*FAIR, "fifo"]))
    def start(self, policy: str) -> None:
        self.policy = get_policy(policy)
        self.fair = policy != "fifo"
        self.model = QueueModel()
        self.now = 0.0
        self.next_id = 1
        self.finished: set[int] = set()

    @rule(tenant=st.sampled_from("abcd"), n=st.integers(1, 3), delay=st.sampled_from([0.0, 0.0, 2.0, 5.0]),
          priority=st.sampled_from([0, 0, 1]), cost=st.sampled_from([1.0, 3.0]))
    def enqueue(self, tenant: str, n: int, delay: float, priority: int, cost: float) -> None:
        known = tenant in self.model.tenants
        was_active = known and self.model.tenants[tenant].active
        v = self.model.activation_vtime()
        if known:
            v = woken_at(self.model.tenants[tenant], v)
        for _ in range(n):
            self.model.enqueue(ModelJob(self.next_id, tenant, priority, self.now + delay, cost), now=self.now)
            self.next_id += 1
        t = self.model.tenants[tenant]
        if not was_active and delay == 0:
            assert t.active and t.vtime == v
        if not known and delay > 0:
            assert not t.active and t.wake_at == self.now + delay

    @rule(batch=st.integers(1, 6))
    def claim(self, batch: int) -> None:
        v = self.model.activation_vtime()
        before = {t.name: (t.running, t.vtime if t.active or not self.fair or t.wake_at is None
                           or t.wake_at > self.now else woken_at(t, v))  # the claim wakes them first
                  for t in self.model.tenants.values()}
        caps = {t.name: t.max_running for t in self.model.tenants.values()}
        due = {j.id for j in self.model.queued.values() if j.is_due(self.now)}
        expect_work = claimable(self.model, self.now)
        ids = self.model.claim(self.policy, batch, now=self.now)
        assert len(ids) == len(set(ids)) <= batch and set(ids) <= due
        assert ids or not expect_work
        taken = Counter(self.model.running[i].tenant for i in ids)
        params = dict(self.policy.params)
        for t in self.model.tenants.values():
            running, vtime = before.get(t.name, (0, 0.0))
            assert t.running == running + taken[t.name] <= max(running, caps[t.name])
            if self.fair and taken[t.name]:
                u = t.weight if params["by_weight"] else 1.0
                jobs = [self.model.running[i] for i in ids if self.model.running[i].tenant == t.name]
                assert t.vtime == vtime + sum((j.cost if params["by_cost"] else 1.0) / u for j in jobs)
                assert t.active == self.model.has_due(t.name, self.now)

    @precondition(lambda self: self.model.running)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.model.running)))
        self.model.finish(job_id)
        self.finished.add(job_id)

    @precondition(lambda self: self.model.running)
    @rule(data=st.data(), delay=st.sampled_from([0.0, 3.0]))
    def retry(self, data: st.DataObject, delay: float) -> None:
        self.model.retry(data.draw(st.sampled_from(sorted(self.model.running))), self.now + delay)

    @precondition(lambda self: self.model.running)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.model.running)))
        tenant = self.model.tenants[self.model.running[job_id].tenant]
        v = woken_at(tenant, self.model.activation_vtime())
        was_active, vtime = tenant.active, tenant.vtime
        self.model.release(job_id)
        assert tenant.active and tenant.vtime == (vtime if was_active else v)

    @rule(tenant=st.sampled_from("abcd"), weight=st.sampled_from([0.5, 1.0, 4.0]),
          cap=st.sampled_from([0, 1, 3]))
    def configure(self, tenant: str, weight: float, cap: int) -> None:
        self.model.set_tenant(tenant, weight, cap)

    @rule(dt=st.sampled_from([1.0, 4.0]))
    def tick(self, dt: float) -> None:
        self.now += dt

    @invariant()
    def every_job_is_in_exactly_one_place(self) -> None:
        queued, running = set(self.model.queued), set(self.model.running)
        assert not (queued & running) and not (queued & self.finished) and not (running & self.finished)
        assert queued | running | self.finished == set(range(1, self.next_id))
        assert Counter(j.tenant for j in self.model.running.values()) == Counter(
            {t.name: t.running for t in self.model.tenants.values() if t.running})

    @invariant()
    def no_queued_job_is_stranded(self) -> None:
        for t in self.model.tenants.values():
            pending = [j.run_at for j in self.model.by_tenant.get(t.name, [])]
            if t.active:
                continue
            if self.fair:                           # fair claims only take from active tenants
                assert t.wake_at == (min(pending) if pending else None)
            elif pending:                           # fifo takes from any tenant: wake_at may be early
                assert t.wake_at is not None and t.wake_at <= min(pending)


TestRandomOperations = RandomOperations.TestCase
TestRandomOperations.settings = settings(max_examples=50, stateful_step_count=30, deadline=None)
