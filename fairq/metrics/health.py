"""The worker's health endpoints, beside /metrics on ``--metrics-port``.

Two questions an orchestrator asks, with different answers during a database outage:

* ``/livez`` (liveness): is the worker's loop alive? 200 while it turns, whether or not the
  database answers: through an outage the loop keeps retrying with backoff (at most 30 s apart)
  and the worker carries on by itself once the database is back, so restarting it would only
  throw its in-flight jobs away. 503 only when the loop has not turned for ``stale_after``
  seconds (60 by default): stuck, and worth a restart.
* ``/readyz`` (readiness): can the worker claim now? 200 when its last loop turn reached the
  database and a fresh ``SELECT 1`` answers; 503 during an outage.

``/healthz`` is the readiness answer too (what it always meant).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

LIVE_PATH = "/livez"
READY_PATH = "/readyz"
HEALTH_PATH = "/healthz"
# The worker's suggested metrics port: the exporter's (9765) neighbour, away from node_exporter
# (9100), Prometheus (9090), Alertmanager (9093), Pushgateway (9091), postgres_exporter (9187).
DEFAULT_METRICS_PORT = 9766


class LoopWatch(Protocol):
    def loop_alive(self) -> bool: ...

    def loop_healthy(self) -> bool: ...


def worker_checks(loop: LoopWatch, database: Callable[[], bool]) -> dict[str, Callable[[], bool]]:
    """The health paths of a worker: path -> check (True: 200, False or raising: 503)."""

    def ready() -> bool:
        return loop.loop_healthy() and database()

    return {LIVE_PATH: loop.loop_alive, READY_PATH: ready, HEALTH_PATH: ready}
