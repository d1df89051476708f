"""Slots counted ahead (decision 015), as pure maths: a model of one tenant's row, its workers'
slots ahead and its running jobs, driven by hypothesis through every interleaving of the steps
the SQL takes (claim.sql: claim_fair's step 5a and give_ahead; slots.sql: return_slots,
return_budgets). What must hold after every step: the jobs running never pass the cap, the row
never counts fewer than run (so a claim grants less, never more), readers' tenant_running is
exact, and the virtual time charged is at least the jobs started over the weight (paid early,
never late)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

AHEAD_BATCHES = 8  # give_ahead: the worker is topped up to 8 batches of virtual time


def slots_ahead(lim: int, weight: float, held: int, room: int) -> int:
    """give_ahead's grant: up to ``8 x lim x weight`` slots held by the worker, only if the
    tenant keeps as much room again after them (room: after the claim's own jobs)."""
    k = math.ceil(AHEAD_BATCHES * lim * weight) - held
    return k if k > 0 and room >= 2 * k else 0


@dataclass
class Row:
    cap: int
    weight: float
    running: int = 0          # tenant_schedule.running: regular claims + slots ahead - folded
    vtime: float = 0.0
    returns: int = 0          # slot_returns not folded
    ahead: dict[str, int] = field(default_factory=dict)  # claim_budgets.slots per worker
    jobs: int = 0             # jobs with status running
    started: int = 0          # jobs ever started

    def tenant_running(self) -> int:
        return self.running - self.returns - sum(self.ahead.values())


class SlotsAhead(RuleBasedStateMachine):
    """Claims that hold the row (with a top-up), claims from slots ahead, finishes that fold or
    leave their slot, the sweep, and a cap lowered."""

    @initialize(cap=st.integers(0, 400), weight=st.sampled_from([0.5, 1.0, 2.0, 3.0]))
    def start(self, cap: int, weight: float) -> None:
        self.row = Row(cap, weight)

    @rule(worker=st.sampled_from("abcd"), want=st.integers(1, 16), waited=st.booleans())
    def claim_holding_the_row(self, worker: str, want: int, waited: bool) -> None:
        r = self.row
        n = max(0, min(want, r.cap - r.running))  # claim_room
        r.running += n
        r.vtime += n / r.weight
        r.jobs += n
        r.started += n
        if n and (waited or worker in r.ahead):
            k = slots_ahead(want, r.weight, r.ahead.get(worker, 0), r.cap - r.running)
            r.running += k  # claim_settle's one write counts them ...
            r.vtime += k / r.weight  # ... and charges them
            if k:
                r.ahead[worker] = r.ahead.get(worker, 0) + k

    @precondition(lambda self: any(self.row.ahead.values()))
    @rule(worker=st.sampled_from("abcd"), want=st.integers(1, 16))
    def claim_from_slots_ahead(self, worker: str, want: int) -> None:
        r = self.row
        if r.running > r.cap:  # step 5a: a lowered cap stops them at once
            return
        n = min(want, r.ahead.get(worker, 0))
        r.ahead[worker] = r.ahead.get(worker, 0) - n
        r.jobs += n
        r.started += n

    @precondition(lambda self: self.row.jobs > 0)
    @rule(folded=st.booleans())
    def finish(self, folded: bool) -> None:
        r = self.row
        r.jobs -= 1
        if folded:
            r.running -= 1
        else:
            r.returns += 1

    @rule()
    def fold(self) -> None:
        r = self.row
        r.running -= r.returns
        r.returns = 0

    @rule(worker=st.sampled_from("abcd"))
    def sweep(self, worker: str) -> None:
        r = self.row
        r.running -= r.ahead.pop(worker, 0)

    @rule(cap=st.integers(0, 400))
    def set_cap(self, cap: int) -> None:
        # Lowering a cap below the jobs running stops no job; the invariant is then that no
        # more start (checked against the cap in force when they started).
        self.row.cap = cap
        self.cap_floor = self.row.jobs

    @invariant()
    def exact(self) -> None:
        r = self.row
        assert r.tenant_running() == r.jobs
        assert r.running - r.returns >= r.jobs
        assert r.jobs <= max(r.cap, getattr(self, "cap_floor", 0))
        assert r.vtime >= r.started / r.weight - 1e-9


TestSlotsAhead = SlotsAhead.TestCase
TestSlotsAhead.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)


@given(lim=st.integers(1, 256), weight=st.floats(0.001, 1000), held=st.integers(0, 10_000),
       room=st.integers(0, 10**6))
def test_a_grant_leaves_as_much_room_again(lim: int, weight: float, held: int, room: int) -> None:
    k = slots_ahead(lim, weight, held, room)
    assert k == 0 or (0 < k <= room - k and held + k == math.ceil(8 * lim * weight))


def test_every_tenant_is_charged_the_same_virtual_time_ahead() -> None:
    """8 batches of virtual time whatever the weight: slots ahead shift no share."""
    for weight in (0.5, 1.0, 3.0):
        k = slots_ahead(16, weight, 0, 10**6)
        assert math.isclose(k / weight, 8 * 16)
