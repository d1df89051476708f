"""``fairq.testing.drain(app)``: every due job run in the calling thread, in the order the real
claim gives them (one job a claim, under the app's policy), finished as a worker finishes them
(results stored, failures retried by the task's attempts and backoff), until none is due. No
worker threads start or stop, so a test that drains ten jobs pays ten claims and ten finishes."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from fairq import validation as v
from fairq.app import App
from fairq.app.hooks import with_hooks
from fairq.errors import InvalidInput
from fairq.job import Job
from fairq.models import ClaimedJob
from fairq.policies import DEFAULT_POLICY, Policy, get_policy
from fairq.results import encode_result
from fairq.runtime.state import describe_error
from fairq.store import Store
from fairq.store.testing import due_count
from fairq.testing.outcome import Outcome, call_sync, outcome

WORKER = "fairq.testing"
# With tenant=, the other tenants' jobs a claim picks are handed back; a claim round that gives
# the tenant none this many times running means it cannot run now (its cap, pause, rate).
_ROUNDS_WITHOUT = 10


def drain(app: App, *, queue: str | None = None, tenant: str | None = None,
          policy: str | Policy = DEFAULT_POLICY, limit: int = 100_000) -> list[Outcome]:
    """Run every due job of ``queue`` (None: every queue of the app's tasks) in fair order
    until none is due, at most ``limit``; returns what each attempt came to. A failure with
    attempts left is queued again for later (``retry``), not run again here.

    With ``tenant``, only that tenant's jobs run: the others' that a claim picks are handed
    back unstarted (no attempt spent), but their turn was charged, so do not assert fair order
    across tenants with ``tenant=``.
    """
    queues = ([v.name("queue", queue)] if queue is not None
              else sorted({t.queue for t in app.tasks.values()}) or ["default"])
    only = None if tenant is None else v.name("tenant", tenant)
    plan = get_policy(policy)
    store = app.store
    tasks = with_hooks(app.tasks, app.attempt_hooks)
    outcomes: list[Outcome] = []
    without = 0
    while len(outcomes) < limit:
        if only is not None and due_count(store, queues, only) == 0:
            break
        ran = False
        for q in queues:
            claimed = store.claim(plan, queue=q, batch=1 if only is None else 10, worker=WORKER)
            if only is not None:
                others = [c for c in claimed if c.tenant != only]
                store.release_unstarted([(c.id, c.attempts) for c in others],
                                        started=[c.started_at for c in others])
                claimed = [c for c in claimed if c.tenant == only]
            for c in claimed:
                outcomes.append(_run(store, tasks, c))
                ran = True
        if not ran:
            without += 1
            if only is None or without >= _ROUNDS_WITHOUT:
                break
        else:
            without = 0
    return outcomes


def _run(store: Store, tasks: Any, claimed: ClaimedJob) -> Outcome:
    job = Job.from_claim(claimed, store)
    task = tasks.get(claimed.task)
    t0 = time.monotonic()
    value: Any = None
    error: Exception | None = None
    if task is None:
        error = InvalidInput(f"unknown task {claimed.task!r}: this app knows "
                             f"{', '.join(sorted(tasks)) or 'nothing'}")
    else:
        try:
            value = call_sync(task.fn, job, "drain")
        except Exception as exc:  # the job fails; BaseException (Ctrl-C) ends the test
            error = exc
    seconds = time.monotonic() - t0
    started = [claimed.started_at]
    if error is None:
        text, note = encode_result(value)
        done = store.finish_done([(job.id, job.attempt)], [text], [note], [seconds],
                                 started=started)
        return outcome(job, "done" if done else "lease_lost", result=value)
    rows = store.finish_failed([(job.id, job.attempt, describe_error(error), None)], (),
                               [seconds], started=started)
    status = "lease_lost" if not rows else "retry" if rows[0].status == "queued" else "failed"
    return outcome(job, status, error=error)


def statuses(outcomes: Sequence[Outcome]) -> dict[str, int]:
    """How many outcomes of each status (a readable summary for an assertion)."""
    out: dict[str, int] = {}
    for o in outcomes:
        out[o.status] = out.get(o.status, 0) + 1
    return out
