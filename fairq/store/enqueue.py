"""What the sync and async stores share to run the ``enqueue`` statement: the chunk size, its
parameters, and its refusals of bad input as ``InvalidInput``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from fairq.errors import InvalidInput
from fairq.models import NewJobColumns

CHUNK = 5000  # jobs per enqueue round trip


def _one_if_all_equal(column: Sequence[Any]) -> list[Any]:
    """``[value]`` if every element of ``column`` is ``value``, else the whole column as a list."""
    values = list(column)
    return values[:1] if values and values.count(values[0]) == len(values) else values


def enqueue_params(jobs: NewJobColumns) -> dict[str, Any]:
    """The ``enqueue`` statement's parameters for one chunk (the sync and async stores').

    The arrays go in binary (the statement's %(name)b): no text quoting of 5,000 payloads.
    A binary array must be of one Python type, hence the float() of costs and delays.
    A column whose jobs all share one value goes as that one value (see the statement), and
    payloads that are all ``{}`` (the default) go as NULL.
    """
    payloads = jobs.payloads_json
    return {
        "queues": _one_if_all_equal(jobs.queues),
        "tenants": jobs.tenants,
        "tasks": _one_if_all_equal(jobs.tasks),
        "payloads": None if payloads.count("{}") == len(payloads) else payloads,
        "priorities": _one_if_all_equal(jobs.priorities),
        "costs": [float(c) for c in _one_if_all_equal(jobs.costs)],
        "run_ats": _one_if_all_equal(jobs.run_ats),
        "max_attempts": _one_if_all_equal(jobs.max_attempts),
        "leases": _one_if_all_equal(jobs.lease_seconds),
        "delays": [None if d is None else float(d) for d in _one_if_all_equal(jobs.delays)],
        "keys": _one_if_all_equal(jobs.keys) if jobs.keys else None,
    }


# The SQLSTATE of the SQL enqueue function's checks on its input: the same refusals as
# fairq.validation, for every client.
INVALID_INPUT_SQLSTATE = "FQ001"


def as_invalid_input(exc: psycopg.Error) -> Exception:
    """The SQL enqueue's refusal as ``InvalidInput`` (one line); any other error as it is."""
    if exc.sqlstate != INVALID_INPUT_SQLSTATE:
        return exc
    message = exc.diag.message_primary or str(exc)
    return InvalidInput(message.removeprefix("fairq: "))
