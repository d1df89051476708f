"""The worker registry's beats: a failed write is logged once, never stops the worker, and the
row comes back with the next beat that succeeds."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

import fairq


def wait_for(condition: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return True
        time.sleep(0.05)
    return False


def test_a_failing_beat_is_logged_once_and_the_worker_goes_on(
        dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    done: list[int] = []
    with fairq.App(dsn) as app:
        app.task(name="t")(lambda job: done.append(job.id))
        worker = app.worker(listen=False, heartbeat_interval=0.1, poll_interval=0.1)
        thread = threading.Thread(target=worker.run, daemon=True)
        with caplog.at_level("INFO", logger="fairq.worker"):
            thread.start()
            try:
                assert worker.ready.wait(20)
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute("ALTER TABLE fairq.workers RENAME TO workers_away")
                    time.sleep(0.6)  # several beats fail
                    first = app.enqueue("t", tenant="a")
                    assert wait_for(lambda: first in done), "the worker stopped working"
                    conn.execute("ALTER TABLE fairq.workers_away RENAME TO workers")
                    back = conn.execute("SELECT now()").fetchone()
                    assert wait_for(lambda: conn.execute(
                        "SELECT count(*) FROM fairq.workers WHERE seen_at > %s",
                        back).fetchone() == (1,))
            finally:
                worker.stop()
                thread.join(30)
    failures = [r for r in caplog.records if "could not write worker" in r.getMessage()]
    assert len(failures) == 1, [r.getMessage() for r in failures]
    assert "\n" not in failures[0].getMessage()  # one line
    assert "is in the registry again" in caplog.text
