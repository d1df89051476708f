"""Scheduling policies, selected by name : fifo, round_robin, weighted (default), drr, time."""

from __future__ import annotations

from fairq.errors import InvalidInput
from fairq.policies.base import Policy

FIFO = Policy(
    name="fifo",
    statement="claim_fifo",
    description="global order by priority, run_at, id (the baseline); caps still apply",
)
ROUND_ROBIN = Policy(
    name="round_robin",
    statement="claim_fair",
    waits=True,
    params=(("by_weight", False), ("by_cost", False), ("by_time", False)),
    description="each runnable tenant one job per turn, weights ignored",
)
WEIGHTED = Policy(
    name="weighted",
    statement="claim_fair",
    waits=True,
    params=(("by_weight", True), ("by_cost", False), ("by_time", False)),
    description="long-run share of claims proportional to weight",
)
DRR = Policy(
    name="drr",
    statement="claim_fair",
    waits=True,
    params=(("by_weight", True), ("by_cost", True), ("by_time", False)),
    description="share of work (sum of job cost) proportional to weight",
)
TIME = Policy(
    name="time",
    statement="claim_fair",
    waits=True,
    params=(("by_weight", True), ("by_cost", False), ("by_time", True)),
    description="share of worker time (seconds run, measured at finish) proportional to weight",
)

POLICIES: dict[str, Policy] = {p.name: p for p in (FIFO, ROUND_ROBIN, WEIGHTED, DRR, TIME)}
DEFAULT_POLICY = "weighted"


def get_policy(name: str | Policy) -> Policy:
    """Look a policy up by name; ``InvalidInput`` names the valid ones."""
    if isinstance(name, Policy):
        return name
    try:
        return POLICIES[name]
    except (KeyError, TypeError):
        raise InvalidInput(
            f"unknown policy {name!r}: choose one of {', '.join(sorted(POLICIES))}"
        ) from None


__all__ = ["DEFAULT_POLICY", "DRR", "FIFO", "POLICIES", "ROUND_ROBIN", "TIME", "WEIGHTED", "Policy",
           "get_policy"]
