"""The operator's API behind ``App.jobs``, ``App.retry``, ``App.cancel_tenant`` and
``app.tenants.delete/reset``: input checked here (``InvalidInput`` before anything is written),
the work done by ``fairq.store.ops``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from fairq import validation as v
from fairq.errors import InvalidInput
from fairq.store import ops

if TYPE_CHECKING:
    from fairq.models import JobInfo
    from fairq.store import Store

STATUSES = ("queued", "running", "done", "failed", "cancelled")
MAX_LIST = 100_000
MAX_RETRY = 100_000
MAX_CANCEL = 1_000_000
DEFAULT_RETRY_LIMIT = 1000
DEFAULT_CANCEL_LIMIT = 100_000


def _limit(value: int, most: int) -> int:
    return v.integer("limit", value, 1, most)


def jobs(store: Store, *, status: str | None, tenant: str | None, task: str | None,
         queue: str | None, limit: int) -> list[JobInfo]:
    if status is not None and status not in STATUSES:
        raise InvalidInput(f"status must be one of {', '.join(STATUSES)}, not {status!r}")
    return ops.list_jobs(
        store, status=status,
        tenant=None if tenant is None else v.name("tenant", tenant),
        task=None if task is None else v.name("task", task),
        queue=None if queue is None else v.name("queue", queue),
        limit=_limit(limit, MAX_LIST))


class Retried(list[int]):
    """What ``App.retry`` did: the ids retried (the list itself), and in ``not_retried`` each
    job it did not retry with why (an id not known, a job not failed or cancelled, a key that a
    live job holds again), by id. ``picked`` counts the jobs looked at (``limit`` bounds it)."""

    def __init__(self, retried: Iterable[int], not_retried: dict[int, str],
                 picked: int) -> None:
        super().__init__(retried)
        self.not_retried = dict(sorted(not_retried.items()))
        self.picked = picked


def retry(store: Store, ids: Iterable[int], *, failed: bool, tenant: str | None,
          limit: int) -> Retried:
    """Retry each job that can be; say why for each of the others (``Retried``)."""
    wanted = [v.integer("job id", i, 1, 2**63 - 1) for i in ids]
    if bool(wanted) == bool(failed):
        raise InvalidInput("give job ids or failed=True (with an optional tenant), not both")
    if wanted and tenant is not None:
        raise InvalidInput("tenant= goes with failed=True, not with job ids")
    if len(wanted) > MAX_RETRY:
        raise InvalidInput(f"at most {MAX_RETRY} job ids at once, not {len(wanted)}")
    given = sorted(set(wanted)) or None
    of = None if tenant is None else v.name("tenant", tenant)
    most = len(given) if given else _limit(limit, MAX_RETRY)
    retried, held, why = ops.retry(store, given, tenant=of, limit=most)
    now_retried = set(retried)
    for h in held:
        holder = (f"job {h.holder}, retried now" if h.holder in now_retried
                  else f"job {h.holder}, queued or running")
        why[h.id] = (f"its idempotency key {h.key!r} is held by {holder}: a key belongs to one "
                     "live job of its task and tenant")
    if given:
        missing = [i for i in given if i not in now_retried and i not in why]
        states = ops.job_states(store, missing) if missing else {}
        for job_id in missing:
            status = states.get(job_id)
            why[job_id] = ("no such job" if status is None
                           else f"it is {status}; only failed or cancelled jobs can be retried"
                           if status not in ("failed", "cancelled")
                           else "another session is changing it; try again")
    return Retried(sorted(retried), why, len(retried) + len(why))


def cancel_tenant(store: Store, tenant: str, *, queue: str | None, limit: int) -> int:
    return ops.cancel_tenant(store, v.name("tenant", tenant),
                             queue=None if queue is None else v.name("queue", queue),
                             limit=_limit(limit, MAX_CANCEL))


def delete_tenant(store: Store, tenant: str) -> bool:
    return ops.delete_tenant(store, v.name("tenant", tenant))


def reset_tenant(store: Store, tenant: str) -> bool:
    return ops.reset_tenant(store, v.name("tenant", tenant))
