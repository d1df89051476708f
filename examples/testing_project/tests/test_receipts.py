"""The shop's tests: only fairq's documented test API (fairq.testing and its fixtures)."""

from __future__ import annotations

from typing import Any

import pytest
from shop import jobs

import fairq
from fairq import testing


@pytest.fixture(autouse=True)
def _no_receipts_yet() -> None:
    jobs.SENT.clear()


def test_an_order_queues_its_receipt(fairq_app: fairq.App) -> None:
    jobs.place_order("acme", 7)
    testing.assert_enqueued(fairq_app, jobs.send_receipt, tenant="acme", payload={"order": 7})
    testing.refute_enqueued(fairq_app, jobs.send_receipt, tenant="beta")


def test_draining_sends_every_receipt_fairly(fairq_app: fairq.App) -> None:
    for order in range(5):
        jobs.place_order("big", order)
    jobs.place_order("small", 100)
    outcomes = testing.drain(fairq_app)
    assert [o.status for o in outcomes] == ["done"] * 6
    assert ("small", 100) in jobs.SENT[:2]  # the small shop does not wait behind the big one
    testing.refute_enqueued(fairq_app)


def test_a_bad_order_fails_and_is_retried_later(fairq_app: fairq.App) -> None:
    jobs.place_order("acme", -1)
    (outcome,) = testing.drain(fairq_app)
    assert outcome.status == "retry" and isinstance(outcome.error, ValueError)


def test_inline_sends_at_once(fairq_app: fairq.App) -> None:
    with testing.inline(fairq_app):
        jobs.place_order("acme", 3)
        with pytest.raises(ValueError, match="no such order"):
            jobs.place_order("acme", -2)
    assert jobs.SENT == [("acme", 3)]
    testing.refute_enqueued(fairq_app, status=None)


def test_an_order_rolled_back_queues_nothing(fairq_app: fairq.App, fairq_connection: Any) -> None:
    jobs.place_order("acme", 9, connection=fairq_connection)
    testing.assert_enqueued(fairq_app, tenant="acme", connection=fairq_connection)
    fairq_connection.rollback()
    testing.refute_enqueued(fairq_app, tenant="acme", connection=fairq_connection)
