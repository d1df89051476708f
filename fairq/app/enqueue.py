"""Enqueue's arguments made into jobs: a task's defaults applied, every value checked before
anything is written (``App.enqueue``, ``App.enqueue_many``, ``App.periodic``)."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from typing import Any

from fairq import validation as v
from fairq.app.options import Item
from fairq.app.ports import TaskDefaults
from fairq.errors import InvalidInput
from fairq.models import NewJob, NewJobColumns

__all__ = ["Item", "new_job", "new_job_chunks", "new_jobs"]


def new_job(tasks: Mapping[str, TaskDefaults], task: str, tenant: str, payload: Any, *,
            run_at: datetime | None, delay: float | timedelta | None, priority: int | None,
            cost: float | None, queue: str | None, max_attempts: int | None = None,
            lease: int | None = None, key: str | None = None) -> NewJob:
    """One job of ``task``: options not given come from the registered task (or the defaults
    when ``tasks`` is empty: an app that registers nothing enqueues by name, unchecked)."""
    v.name("task", task)
    registered = tasks.get(task)
    if registered is None and tasks:
        raise InvalidInput(f"unknown task {task!r}: this app registers {', '.join(sorted(tasks))}")
    v.run_at(run_at, delay)
    return NewJob(
        task=task,
        tenant=v.name("tenant", tenant),
        payload_json=v.payload({} if payload is None else payload),
        queue=v.name("queue", queue if queue is not None
                     else (registered.queue if registered else "default")),
        priority=v.priority(priority if priority is not None
                            else (registered.priority if registered else 0)),
        cost=v.cost(cost if cost is not None else (registered.cost if registered else 1.0)),
        run_at=run_at,
        delay=v.delay_seconds(delay),
        max_attempts=v.max_attempts(max_attempts if max_attempts is not None
                                    else (registered.max_attempts if registered else 5)),
        lease_seconds=v.lease(lease if lease is not None
                              else (registered.lease if registered else 300)),
        key=None if key is None else v.name("key", key),
    )


def new_jobs(tasks: Mapping[str, TaskDefaults], task: str, items: Iterable[Item], *,
             run_at: datetime | None, delay: float | timedelta | None,
             priority: int | None, cost: float | None, queue: str | None) -> NewJobColumns:
    """``enqueue_many``'s items, validated, as the columns the store sends."""
    chunks = new_job_chunks(tasks, task, items, size=sys.maxsize, run_at=run_at, delay=delay,
                            priority=priority, cost=cost, queue=queue)
    return next(chunks, None) or NewJobColumns.of([])


def new_job_chunks(tasks: Mapping[str, TaskDefaults], task: str, items: Iterable[Item], *,
                   size: int, run_at: datetime | None, delay: float | timedelta | None,
                   priority: int | None, cost: float | None,
                   queue: str | None) -> Iterator[NewJobColumns]:
    """``enqueue_many``'s items as the columns the store sends, ``size`` jobs a chunk (the
    last may be shorter, none is empty), each validated only when it is asked for: the store
    can send one chunk and check the next while the server inserts it."""
    pairs = iter(items)
    first_pair = next(pairs, None)
    if first_pair is None:
        return
    # The first job goes through every check (so errors come in enqueue's order); the rest
    # share its task, queue and options and differ only in tenant, payload and key.
    tenant0, payload0, key0 = _item(first_pair, 0)
    first = new_job(tasks, task, tenant0, payload0, run_at=run_at, delay=delay,
                    priority=priority, cost=cost, queue=queue, key=key0)
    tenants = [first.tenant]
    payloads = [first.payload_json]
    keys: list[str | None] = [first.key]
    valid_tenants = {first.tenant}
    check_name, check_payload = v.name, v.payload
    done = 0  # items of the chunks already yielded
    for item in pairs:
        if len(tenants) == size:
            yield _columns(first, tenants, payloads, keys)
            done += size
            tenants, payloads, keys = [], [], []
        if type(item) is tuple and len(item) == 2:  # the common shape, checked cheaply
            tenant, payload = item
            key = None
        else:
            tenant, payload, key = _item(item, done + len(tenants))
            if key is not None:
                check_name("key", key)
        if type(tenant) is not str or tenant not in valid_tenants:
            valid_tenants.add(check_name("tenant", tenant))
        tenants.append(tenant)
        # No payload, or an empty object (a job that only needs its task and tenant): its
        # JSON text, without the encoder.
        payloads.append("{}" if payload is None or (type(payload) is dict and not payload)
                        else check_payload(payload))
        keys.append(key)
    yield _columns(first, tenants, payloads, keys)


def _columns(first: NewJob, tenants: list[str], payloads: list[str],
             keys: list[str | None]) -> NewJobColumns:
    """One chunk of ``enqueue_many``: its tenants, payloads and keys, the rest ``first``'s."""
    n = len(tenants)
    return NewJobColumns(
        tasks=[first.task] * n, tenants=tenants, payloads_json=payloads,
        queues=[first.queue] * n, priorities=[first.priority] * n, costs=[first.cost] * n,
        run_ats=[first.run_at] * n, delays=[first.delay] * n,
        max_attempts=[first.max_attempts] * n, lease_seconds=[first.lease_seconds] * n,
        keys=keys if any(k is not None for k in keys) else (),
    )


def _item(item: Any, index: int) -> tuple[Any, Any, Any]:
    """One ``enqueue_many`` item as (tenant, payload, key): a pair or a triple, nothing else
    (a string would unpack into its characters)."""
    if isinstance(item, tuple | list) and len(item) in (2, 3):
        return (item[0], item[1], item[2] if len(item) == 3 else None)
    raise InvalidInput(f"enqueue_many item {index} must be a (tenant, payload) pair or a "
                       f"(tenant, payload, key) triple, not {type(item).__name__} {item!r:.60}")
