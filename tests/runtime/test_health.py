"""The worker's health endpoints: /livez stays 200 through a database outage (the loop keeps
turning and recovers by itself), /readyz and /healthz say whether it can claim. The outage is a
private PostgreSQL cluster stopped under a running worker (tests/support/pgcluster.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import fairq
from fairq.errors import InvalidInput
from fairq.metrics import PrometheusObserver, serve, start_worker_metrics
from tests.support.fault_tools import migrated_db, private_cluster, restart, wait_for


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_liveness_follows_the_loop_not_the_database() -> None:
    now = [100.0]
    obs = PrometheusObserver(stale_after=60.0, clock=lambda: now[0])
    assert obs.loop_alive() and not obs.loop_healthy()  # starting: alive, not ready
    obs.on_loop(False)  # the database is away: still alive
    now[0] += 59
    assert obs.loop_alive() and not obs.loop_healthy()
    now[0] += 2  # no turn for 61 s: stuck
    assert not obs.loop_alive()
    obs.on_loop(True)
    assert obs.loop_alive() and obs.loop_healthy()


def test_worker_health_through_a_database_outage(tmp_path: Path) -> None:
    with private_cluster(tmp_path) as holder:
        dsn = migrated_db(holder[0])
        app = fairq.App(dsn)
        app.task(name="t")(lambda job: None)
        observer = start_worker_metrics(app, host="127.0.0.1", port=0)
        assert observer.server is not None
        url = observer.server.url
        worker = app.worker(observer=observer, poll_interval=0.2, max_backoff=1.0)
        thread = threading.Thread(target=worker.run, daemon=True)
        try:
            thread.start()
            assert worker.ready.wait(30)
            wait_for(lambda: status(f"{url}/readyz") == 200, what="ready")
            assert status(f"{url}/livez") == 200 and status(f"{url}/healthz") == 200

            holder[0].stop("fast")
            wait_for(lambda: status(f"{url}/readyz") == 503, what="not ready in the outage")
            assert status(f"{url}/healthz") == 503
            # Several backoff periods into the outage the loop still turns: alive.
            errors = worker.stats.db_errors
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline and worker.stats.db_errors < errors + 2:
                assert status(f"{url}/livez") == 200
                time.sleep(0.2)
            assert worker.stats.db_errors >= errors + 2  # more turns, each a failure
            assert status(f"{url}/livez") == 200 and status(f"{url}/readyz") == 503

            holder[0] = restart(holder[0])
            wait_for(lambda: status(f"{url}/readyz") == 200, timeout=60, what="ready again")
            job = app.enqueue("t", tenant="a")
            wait_for(lambda: (info := app.job(job)) is not None and info.status == "done",
                     timeout=60, what="a job after the outage")
            assert status(f"{url}/livez") == 200
            assert status(f"{url}/nope") == 404
        finally:
            worker.stop()
            thread.join(30)
            observer.server.close()
            app.close()


def test_a_port_in_use_is_named(tmp_path: Path, dsn: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(InvalidInput, match=f"port {port} is already in use"):
            serve(port, "127.0.0.1")
        (tmp_path / "hp_tasks.py").write_text("import fairq\napp = fairq.App()\n"
                                              "app.task(name='t')(lambda job: None)\n")
        proc = subprocess.run(
            [sys.executable, "-m", "fairq", "--dsn", dsn, "worker", "hp_tasks:app",
             "--metrics-port", str(port)],
            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and f"port {port} is already in use" in proc.stderr
