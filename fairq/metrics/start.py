"""``fairq worker --metrics-port``'s wiring: an observer, its server and the worker's health
paths, installed on the app."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fairq.metrics.checks import db_check
from fairq.metrics.observer import PrometheusObserver
from fairq.metrics.server import serve

if TYPE_CHECKING:
    from fairq.app import App


def start_worker_metrics(app: App, *, host: str = "0.0.0.0", port: int = 0,
                         max_tenants: int | None = None) -> PrometheusObserver:
    """What ``fairq worker --metrics-port`` installs: an observer plus its server.

    /livez is 200 while the worker loop turns, database or not; /readyz and /healthz are 200
    while it reaches the database and a ``SELECT 1`` answers (see fairq.metrics.health).
    """
    from fairq.metrics.health import worker_checks

    observer = PrometheusObserver(max_tenants=max_tenants)
    checks = worker_checks(observer, db_check(app.dsn))
    observer.server = serve(port, host, health=checks["/healthz"], registry=observer.registry,
                            checks=checks)
    app.observer = observer  # enqueues made by this process's handlers are counted too
    return observer
