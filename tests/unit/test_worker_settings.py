"""The worker's claim sizes: a default batch of twice the slots (10 to 256), as many jobs
claimed ahead as the slots (at most one batch), and bad values refused with one line."""

from __future__ import annotations

import pytest

from fairq.errors import InvalidInput
from fairq.runtime import WorkerSettings


@pytest.mark.parametrize(("slots", "batch", "ahead"), [
    (1, 10, 1), (4, 10, 4), (8, 16, 8), (32, 64, 32), (200, 256, 200), (500, 256, 256)])
def test_default_batch_and_claim_ahead_follow_the_slots(slots: int, batch: int,
                                                        ahead: int) -> None:
    s = WorkerSettings(concurrency=slots)
    assert (s.max_batch, s.ahead) == (batch, ahead)


def test_claim_ahead_as_given() -> None:
    assert WorkerSettings(concurrency=8, claim_ahead=0).ahead == 0
    assert WorkerSettings(concurrency=8, claim_ahead=3, batch=2).ahead == 3
    assert WorkerSettings(concurrency=8, batch=2).ahead == 2  # at most one batch by default


@pytest.mark.parametrize("bad", [-1, 1025, True, 1.5, "4"])
def test_bad_claim_ahead_is_one_clear_error(bad: object) -> None:
    with pytest.raises(InvalidInput, match=r"^claim_ahead must be an integer from 0 to 1024"):
        WorkerSettings(claim_ahead=bad)  # type: ignore[arg-type]
