"""A stopping worker wakes its LISTEN thread at once: the wait on the socket ends when stop()
is called, not after the check interval (which an empty ``run(until_empty=True)`` and every
SIGTERM used to wait out)."""

from __future__ import annotations

import threading

from fairq.runtime.listener import Listener
from fairq.store.listen import channel_for


def test_stop_ends_the_wait_at_once_whatever_the_check_interval(dsn: str) -> None:
    woken: list[frozenset[str]] = []
    listener = Listener(dsn, channel_for("fairq"), ["default"], woken.append,
                        check_interval=3600.0)  # without the wake-up, stop() would wait 1 h
    listener.start()
    assert listener.connected.wait(30)
    stopped = threading.Event()
    threading.Thread(target=lambda: (listener.stop(timeout=60), stopped.set()),
                     daemon=True).start()
    assert stopped.wait(30), "stop() waited for the check interval"
    assert listener._thread is not None and not listener._thread.is_alive()
    listener.stop()  # a second stop is harmless


def test_notifications_still_arrive_and_stop_after_a_reconnect(dsn: str) -> None:
    import psycopg

    woken: list[frozenset[str]] = []
    got = threading.Event()
    listener = Listener(dsn, channel_for("fairq"), ["default"],
                        lambda q: (woken.append(q), q and got.set()), check_interval=3600.0)
    listener.start()
    assert listener.connected.wait(30)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_notify('fairq_fairq', 'default')")
    assert got.wait(30)
    assert frozenset({"default"}) in woken
    listener.stop(timeout=60)
    assert listener._thread is not None and not listener._thread.is_alive()
