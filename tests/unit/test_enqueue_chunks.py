"""``App.enqueue_many``'s items made into chunks (fairq.app.enqueue.new_job_chunks): the same
jobs, checks and errors as one validation of the whole list, ``size`` jobs a chunk."""

from __future__ import annotations

from typing import Any

import pytest

from fairq import validation as v
from fairq.app.enqueue import new_job_chunks, new_jobs
from fairq.errors import InvalidInput

OPTIONS: dict[str, Any] = {"run_at": None, "delay": None, "priority": None, "cost": None,
                           "queue": None}
PAYLOADS: list[Any] = [{}, None, {"n": 1}, [], "", 0, {"a": {}}, {"": None}, [{}]]


def test_chunks_hold_the_jobs_one_validation_makes() -> None:
    items = [(f"t{i % 3}", PAYLOADS[i % len(PAYLOADS)]) for i in range(25)]
    whole = new_jobs({}, "t", items, **OPTIONS)
    chunks = list(new_job_chunks({}, "t", items, size=10, **OPTIONS))
    assert [len(c) for c in chunks] == [10, 10, 5]
    for field in ("tasks", "tenants", "payloads_json", "queues", "priorities", "costs",
                  "run_ats", "delays", "max_attempts", "lease_seconds"):
        assert [x for c in chunks for x in getattr(c, field)] == list(getattr(whole, field))
    # An empty object and no payload are "{}" without the encoder; the rest are its text.
    assert list(whole.payloads_json) == [v.payload({} if p is None else p) for _, p in items]


def test_chunks_are_checked_only_when_asked_for_and_name_the_bad_item() -> None:
    items: list[Any] = [("a", {})] * 12 + [("", {})]
    chunks = new_job_chunks({}, "t", items, size=5, **OPTIONS)
    assert len(next(chunks)) == 5 and len(next(chunks)) == 5  # the bad item not reached yet
    with pytest.raises(InvalidInput, match="tenant"):
        next(chunks)
    with pytest.raises(InvalidInput, match="item 11 must be"):
        list(new_job_chunks({}, "t", [("a", {})] * 11 + ["oops"], size=5, **OPTIONS))


def test_a_full_last_chunk_is_not_followed_by_an_empty_one() -> None:
    assert [len(c) for c in new_job_chunks({}, "t", [("a", {})] * 10, size=5, **OPTIONS)] == [5, 5]
    assert list(new_job_chunks({}, "t", [], size=5, **OPTIONS)) == []
