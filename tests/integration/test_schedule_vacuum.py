"""The worker's VACUUM of tenant_schedule: keeps the hot scheduler table small."""

from __future__ import annotations

import time

import psycopg
import pytest

from fairq.policies import get_policy
from fairq.runtime.maintenance import ScheduleVacuum
from fairq.store import Store
from tests.support.fairtools import fill, sql_rows


def vacuum_stats(dsn: str) -> tuple[int, object]:
    ((dead, last),) = sql_rows(dsn, "SELECT n_dead_tup, last_vacuum FROM pg_stat_user_tables "
                                    "WHERE relid = 'fairq.tenant_schedule'::regclass")
    return int(dead), last


def churn(store: Store, claims: int = 15) -> None:
    """Claims and finishes that leave dead schedule rows."""
    pol = get_policy("weighted")
    for _ in range(claims):
        got = store.claim(pol, queue="default", batch=10, worker="w")
        store.finish_done([(j.id, j.attempts) for j in got])
    # An idle backend reports its statistics up to 10 s later: ask the pool's connections
    # (those we reach) to report now; wait_for_dead still polls for the rest.
    for _ in range(store.pool.max_size):
        with store.pool.connection() as conn:
            conn.execute("SELECT pg_stat_force_next_flush()")


def wait_for_dead(dsn: str) -> int:
    deadline = time.monotonic() + 10
    while vacuum_stats(dsn)[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.2)                      # statistics reach the view within a second or so
    return vacuum_stats(dsn)[0]


def test_schedule_vacuum_clears_dead_schedule_rows(store: Store, dsn: str) -> None:
    fill(store, {f"t{i}": 30 for i in range(5)})
    churn(store)
    assert wait_for_dead(dsn) > 0
    service = ScheduleVacuum(store, min_dead=1)
    service.run_once()
    assert service.vacuums == 1
    deadline = time.monotonic() + 10
    while vacuum_stats(dsn)[1] is None and time.monotonic() < deadline:
        time.sleep(0.2)
    dead, last = vacuum_stats(dsn)
    assert last is not None and dead == 0


def test_schedule_vacuum_waits_for_enough_dead_rows(store: Store, dsn: str) -> None:
    """A few dead rows wait (for min_dead more, or max_age); an idle table is never vacuumed."""
    fill(store, {f"t{i}": 100 for i in range(5)})
    idle = ScheduleVacuum(store, min_dead=1, max_age=0)
    idle.run_once()   # nothing ever died: nothing to do, however old the last VACUUM
    assert idle.vacuums == 0
    churn(store)
    dead = wait_for_dead(dsn)
    assert dead > 0
    store.vacuum_tenant_schedule()           # a fresh VACUUM: last_vacuum is now
    churn(store, 3)
    few = wait_for_dead(dsn)
    assert 0 < few < 1000
    waits = ScheduleVacuum(store, min_dead=1000, max_age=3600)
    waits.run_once()
    assert waits.vacuums == 0 and vacuum_stats(dsn)[0] == few
    ScheduleVacuum(store, min_dead=1000, max_age=0).run_once()   # old enough: now it runs
    deadline = time.monotonic() + 10
    while vacuum_stats(dsn)[0] != 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert vacuum_stats(dsn)[0] == 0
    churn(store, 3)
    assert wait_for_dead(dsn) > 0
    enough = ScheduleVacuum(store, min_dead=1, max_age=3600)
    enough.run_once()
    assert enough.vacuums == 1


def test_schedule_vacuum_without_ownership_gives_up_quietly(caplog: pytest.LogCaptureFixture) -> None:
    class NotOwner:
        calls = 0

        def schedule_vacuum_due(self, min_dead: int, max_age: float) -> bool:
            return True

        def vacuum_tenant_schedule(self) -> None:
            NotOwner.calls += 1
            raise psycopg.errors.InsufficientPrivilege("must be owner of table tenant_schedule")

    service = ScheduleVacuum(NotOwner())  # type: ignore[arg-type]
    assert service.run_once() == 0 and service.run_once() == 0
    assert NotOwner.calls == 1 and service.disabled
    assert "autovacuum" in caplog.text


def test_schedule_vacuum_without_statistics_always_runs(store: Store, dsn: str) -> None:
    """track_counts off: n_dead_tup stays 0, so the statistics cannot say; VACUUM every check."""
    assert store.schedule_vacuum_due(10**9, 3600) is False   # counted, and nothing died
    blind = Store(dsn, "fairq", min_size=1, max_size=1)
    try:
        with blind.pool.connection() as conn:   # the pool's only connection keeps the setting
            conn.execute("SET track_counts = off")
        assert blind.schedule_vacuum_due(10**9, 3600) is True
    finally:
        blind.close()
