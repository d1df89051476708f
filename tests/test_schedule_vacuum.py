"""The worker's VACUUM of tenant_schedule: keeps the hot scheduler table small (R21)."""

from __future__ import annotations

import time

import psycopg
import pytest
from fairtools import fill, sql_rows

from fairq.maintenance import ScheduleVacuum
from fairq.policies import get_policy
from fairq.store import Store


def vacuum_stats(dsn: str) -> tuple[int, object]:
    ((dead, last),) = sql_rows(dsn, "SELECT n_dead_tup, last_vacuum FROM pg_stat_user_tables "
                                    "WHERE relid = 'fairq.tenant_schedule'::regclass")
    return int(dead), last


def test_schedule_vacuum_clears_dead_schedule_rows(store: Store, dsn: str) -> None:
    fill(store, {f"t{i}": 30 for i in range(5)})
    pol = get_policy("weighted")
    for _ in range(15):
        got = store.claim(pol, queue="default", batch=10, worker="w")
        store.finish_done([(j.id, j.attempts) for j in got])
    deadline = time.monotonic() + 10
    while vacuum_stats(dsn)[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.2)                      # statistics reach the view within a second or so
    assert vacuum_stats(dsn)[0] > 0
    ScheduleVacuum(store).run_once()
    deadline = time.monotonic() + 10
    while vacuum_stats(dsn)[1] is None and time.monotonic() < deadline:
        time.sleep(0.2)
    dead, last = vacuum_stats(dsn)
    assert last is not None and dead == 0


def test_schedule_vacuum_without_ownership_gives_up_quietly(caplog: pytest.LogCaptureFixture) -> None:
    class NotOwner:
        calls = 0

        def vacuum_tenant_schedule(self) -> None:
            NotOwner.calls += 1
            raise psycopg.errors.InsufficientPrivilege("must be owner of table tenant_schedule")

    service = ScheduleVacuum(NotOwner())  # type: ignore[arg-type]
    assert service.run_once() == 0 and service.run_once() == 0
    assert NotOwner.calls == 1 and service.disabled
    assert "autovacuum" in caplog.text
