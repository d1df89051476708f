"""Every database error by name: SQLSTATEs to kinds, the line a worker logs for each (what it
does next), how long it waits, and the metric that counts them."""

from __future__ import annotations

import psycopg
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from psycopg import errors
from psycopg_pool import PoolTimeout

from fairq.metrics import PrometheusObserver
from fairq.observe import DB_ERROR_KINDS, NullObserver
from fairq.runtime.db_errors import RECONNECT_CAP, RETRY_CAP, observe, react
from fairq.store.errors import error_kind

CASES = [
    (errors.DeadlockDetected("deadlock detected"), "deadlock", "deadlock:"),
    (errors.SerializationFailure("could not serialize"), "serialization_failure",
     "serialization failure:"),
    (errors.AdminShutdown("terminating connection due to administrator command"),
     "admin_shutdown", "session ended by the server"),
    (errors.CrashShutdown("crash"), "admin_shutdown", "session ended by the server"),
    (errors.CannotConnectNow("the database system is starting up"), "admin_shutdown",
     "session ended by the server"),
    (psycopg.OperationalError("the connection is closed"), "connection_lost", "connection lost"),
    (errors.ConnectionFailure("connection failure"), "connection_lost", "connection lost"),
    (errors.QueryCanceled("canceling statement due to statement timeout"), "statement_timeout",
     "statement timeout:"),
    (errors.LockNotAvailable("canceling statement due to lock timeout"), "lock_timeout",
     "lock timeout:"),
    (PoolTimeout("couldn't get a connection after 5.00 sec"), "pool_timeout", "pool timeout:"),
    (errors.UniqueViolation("duplicate key"), "other", "database error"),
]


@pytest.mark.parametrize(("error", "kind", "start"), CASES,
                         ids=[type(c[0]).__name__ for c in CASES])
def test_each_error_has_its_name_and_says_what_comes_next(
        error: BaseException, kind: str, start: str) -> None:
    assert error_kind(error) == kind
    r = react(error, 1, 30.0, "claiming again")
    assert r.kind == kind and r.line.startswith(start), r.line
    assert r.line.endswith(f"claiming again in {r.delay:.2f}s")
    assert type(error).__name__ in r.line
    assert r.drop_connections == (kind in ("admin_shutdown", "connection_lost", "pool_timeout"))
    assert r.unexpected == (kind == "other")


def test_every_kind_is_covered() -> None:
    assert {c[1] for c in CASES} == set(DB_ERROR_KINDS)


def test_waits_per_kind() -> None:
    """A deadlock retries within tens of milliseconds, a lost server within RECONNECT_CAP
    however long it failed, a timeout backs off up to max_backoff."""
    for failures in (1, 2, 5, 50):
        d = react(errors.DeadlockDetected("x"), failures, 30.0, "x").delay
        assert d <= RETRY_CAP and (failures > 1 or d <= 0.05)
        c = react(errors.AdminShutdown("x"), failures, 30.0, "x").delay
        assert c <= RECONNECT_CAP and (failures > 1 or c <= 0.1)
    assert react(errors.LockNotAvailable("x"), 50, 30.0, "x").delay > RECONNECT_CAP
    assert react(errors.LockNotAvailable("x"), 50, 30.0, "x").delay <= 30.0
    assert react(errors.AdminShutdown("x"), 50, 0.5, "x").delay <= 0.5  # max_backoff holds


def test_the_metric_counts_by_kind_every_kind_from_zero() -> None:
    obs = PrometheusObserver(CollectorRegistry(), max_tenants=5)
    text = generate_latest(obs.registry).decode()
    for kind in DB_ERROR_KINDS:
        assert f'fairq_db_errors_total{{kind="{kind}"}} 0.0' in text
    observe(obs, "deadlock")
    observe(obs, "deadlock")
    observe(obs, "admin_shutdown")
    text = generate_latest(obs.registry).decode()
    assert 'fairq_db_errors_total{kind="deadlock"} 2.0' in text
    assert 'fairq_db_errors_total{kind="admin_shutdown"} 1.0' in text


def test_an_observer_without_the_hook_still_works() -> None:
    class Old:
        pass

    observe(Old(), "deadlock")  # type: ignore[arg-type]
    observe(NullObserver(), "deadlock")
