"""Periodic schedules: a task enqueued for a tenant at each tick of a cron expression.

Declared in code (``App.periodic``); the workers' maintenance
(``fairq.runtime.maintenance.PeriodicScheduler``) enqueues their ticks. Only the cron maths lives
here, on times read from the database clock: the cron expression is evaluated in UTC, with an
optional leading seconds field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from cronsim import CronSim, CronSimError

from fairq import validation as v
from fairq.errors import InvalidInput
from fairq.models import NewJob

if TYPE_CHECKING:
    from fairq.store import Store


# A cron expression is short; a field of thousands of digits would reach int()'s own limit.
MAX_CRON_CHARS = 200


def cron(expr: Any) -> str:
    """A cron expression cronsim accepts (5 fields, or 6 with seconds first) that fires at most
    once a minute, else InvalidInput.

    Several seconds in the seconds field (``* * * * * *``, ``*/10 * * * * *``) are refused:
    an idle worker runs the schedules only on its polls (every 5 s by default) and enqueues the
    latest due tick of each, so ticks closer together than that would be skipped, not each
    enqueued once. A single second (``30 */5 * * * *``) is a tick a minute at most.
    """
    if not isinstance(expr, str):
        raise InvalidInput(f"cron must be a string, not {type(expr).__name__}")
    if len(expr) > MAX_CRON_CHARS:
        raise InvalidInput(f"cron expression of {len(expr):,} characters (at most "
                           f"{MAX_CRON_CHARS}): {expr[:40]!r}...")
    try:
        schedule = CronSim(expr, datetime(2000, 1, 1, tzinfo=UTC))
        next(schedule)
    except (CronSimError, StopIteration, ValueError) as exc:  # ValueError: int() of a field
        raise InvalidInput(f"invalid cron expression {expr!r}: {str(exc)[:200]}") from None
    if len(schedule.seconds) > 1:
        raise InvalidInput(
            f"cron {expr!r} fires more than once a minute (seconds field "
            f"{schedule.parts[0]!r}); periodic schedules fire at most once a minute: give one "
            "second in the seconds field, or use 5 fields")
    return expr


def latest_tick(expr: str, now: datetime) -> datetime:
    """The last tick at or before ``now`` (UTC)."""
    now = now.astimezone(UTC)
    # cronsim's reverse iteration starts at ``now`` itself only when it has microseconds.
    start = now if now.microsecond else now + timedelta(microseconds=1)
    return next(CronSim(expr, start, reverse=True))


def next_tick(expr: str, after: datetime) -> datetime:
    """The first tick strictly after ``after`` (UTC)."""
    return next(CronSim(expr, after.astimezone(UTC)))


@dataclass(frozen=True)
class Periodic:
    """One schedule: ``task`` for ``tenant`` at each tick of ``cron``; (name, tenant) is its key.

    ``job`` is the validated job of every tick; its run_at becomes the tick.
    """

    name: str
    tenant: str
    task: str
    cron: str
    job: NewJob

    @property
    def key(self) -> tuple[str, str]:
        return (self.name, self.tenant)

    def job_for(self, tick: datetime) -> NewJob:
        return dataclasses.replace(self.job, run_at=tick, delay=None)


@dataclass(frozen=True)
class ScheduleInfo:
    """A schedule as ``fairq periodic list`` shows it; ``declared`` is False for a row of the
    periodic table that this app does not declare (a schedule removed from the code)."""

    name: str
    tenant: str
    task: str
    cron: str
    queue: str | None
    last_tick: datetime | None
    last_job_id: int | None
    next_tick: datetime | None
    declared: bool = True


def check_key(name: str, tenant: str) -> tuple[str, str]:
    return v.name("periodic name", name), v.name("tenant", tenant)


def describe(store: Store, periodics: Mapping[tuple[str, str], Periodic]
             ) -> list[ScheduleInfo]:
    """An app's schedules (``App.periodics``) with their state (last tick and job, next tick,
    on the database clock), then the periodic table's rows the app does not declare."""
    now, rows = store.periodic_list()
    state = {(r["name"], r["tenant"]): r for r in rows}
    shown = []
    for key, s in sorted(periodics.items()):
        row = state.pop(key, None)
        last = row["last_tick"] if row else None
        shown.append(ScheduleInfo(s.name, s.tenant, s.task, s.cron, s.job.queue, last,
                                  row["last_job_id"] if row else None,
                                  next_tick(s.cron, now)))
    shown += [ScheduleInfo(r["name"], r["tenant"], r["task"], r["cron"], None, r["last_tick"],
                           r["last_job_id"], None, declared=False) for r in state.values()]
    return shown
