"""What a test enqueued, and assertions on it that fail with a list of what is there."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fairq import validation as v
from fairq.app import App, Task
from fairq.models import JobInfo
from fairq.store.testing import enqueued_jobs

_SHOWN = 20  # a failure lists at most this many jobs


def enqueued(app: App, task: Task[Any] | str | None = None, tenant: str | None = None,
             payload: Any = None, *, queue: str | None = None,
             status: str | Iterable[str] | None = "queued", connection: Any = None,
             limit: int = 10_000) -> list[JobInfo]:
    """The jobs of ``app``'s schema matching every filter given, oldest first. ``payload``
    matches a job whose payload contains it (the keys given, with those values); ``status``
    defaults to queued (None: any); ``connection`` reads in that transaction, so a test sees
    what it enqueued before it commits."""
    name = task.name if isinstance(task, Task) else task
    statuses = [status] if isinstance(status, str) else None if status is None else list(status)
    return enqueued_jobs(
        app.store, task=None if name is None else v.name("task", name),
        tenant=None if tenant is None else v.name("tenant", tenant),
        queue=None if queue is None else v.name("queue", queue), statuses=statuses,
        payload_json=None if payload is None else v.payload(payload), limit=limit,
        connection=connection)


def assert_enqueued(app: App, task: Task[Any] | str | None = None, tenant: str | None = None,
                    payload: Any = None, *, count: int | None = None, queue: str | None = None,
                    status: str | Iterable[str] | None = "queued",
                    connection: Any = None) -> list[JobInfo]:
    """Assert that a job (``count``: exactly that many) matches; returns the matches."""
    found = enqueued(app, task, tenant, payload, queue=queue, status=status,
                     connection=connection)
    if (count is None and found) or (count is not None and len(found) == count):
        return found
    want = "a job" if count is None else f"{count} job(s)"
    raise AssertionError(f"expected {want} {_filters(task, tenant, payload, queue, status)}, "
                         f"found {len(found)}\n"
                         + _listing(app, queue, status, connection))


def refute_enqueued(app: App, task: Task[Any] | str | None = None, tenant: str | None = None,
                    payload: Any = None, *, queue: str | None = None,
                    status: str | Iterable[str] | None = "queued",
                    connection: Any = None) -> None:
    """Assert that no job matches."""
    found = enqueued(app, task, tenant, payload, queue=queue, status=status,
                     connection=connection)
    if found:
        raise AssertionError(f"expected no job {_filters(task, tenant, payload, queue, status)}"
                             f", found {len(found)}\n" + _listing(app, queue, status, connection))


def _filters(task: Task[Any] | str | None, tenant: str | None, payload: Any,
             queue: str | None, status: str | Iterable[str] | None) -> str:
    parts = [f"{k}={val!r}" for k, val in (
        ("task", task.name if isinstance(task, Task) else task), ("tenant", tenant),
        ("payload", payload), ("queue", queue)) if val is not None]
    parts.append(f"status={status if isinstance(status, str) or status is None else list(status)!r}")
    return "with " + ", ".join(parts)


def _listing(app: App, queue: str | None, status: str | Iterable[str] | None,
             connection: Any) -> str:
    jobs = enqueued(app, queue=queue, status=status, connection=connection, limit=_SHOWN + 1)
    if not jobs:
        return "nothing of that status is enqueued"
    lines = [f"  job {j.id}: task={j.task!r} tenant={j.tenant!r} queue={j.queue!r} "
             f"status={j.status} payload={j.payload!r:.120}" for j in jobs[:_SHOWN]]
    more = "\n  ..." if len(jobs) > _SHOWN else ""
    return "enqueued (same queue and status):\n" + "\n".join(lines) + more
