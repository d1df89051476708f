"""The seam between the worker runtime and whatever watches it (Prometheus, tests, logs).

The worker calls these hooks; it never imports prometheus-client itself. ``NullObserver`` is
the default; ``fairq.metrics.PrometheusObserver`` is the one ``--metrics-port`` installs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from fairq.models import ClaimedJob, FinishedJob

# The kinds of database error a worker names (``fairq.store.errors.error_kind``): the label of
# `fairq_db_errors_total` and the first words of the line it logs (docs/reliability.md).
DB_ERROR_KINDS = ("deadlock", "serialization_failure", "admin_shutdown", "connection_lost",
                  "statement_timeout", "lock_timeout", "pool_timeout", "other")


class WorkerObserver(Protocol):
    def on_enqueue(self, queue: str, tenant: str, count: int) -> None: ...

    def on_claim(self, queue: str, policy: str, result: str, seconds: float,
                 jobs: Sequence[ClaimedJob]) -> None:
        """One claim round trip; result is 'claimed', 'empty' or 'error'."""

    def on_finish(self, job: ClaimedJob, outcome: str, run_seconds: float) -> None:
        """outcome: 'done', 'retry', 'failed' or 'lease_lost'."""

    def on_reap(self, queue: str, expired: int, failed: int = 0) -> None:
        """``expired`` leases reaped in ``queue``, ``failed`` of them failed for good."""

    def on_loop(self, healthy: bool) -> None:
        """Called every worker loop turn; ``healthy`` is False while the database is unreachable."""

    def on_db_error(self, kind: str) -> None:
        """A database error a worker thread met; kind: one of DB_ERROR_KINDS."""

    def on_reconnect(self) -> None:
        """The database answers again after an outage (one call per outage, not per
        connection: fairq.runtime.outage)."""


class NullObserver:
    """Observes nothing."""

    def on_enqueue(self, queue: str, tenant: str, count: int) -> None:
        pass

    def on_claim(self, queue: str, policy: str, result: str, seconds: float,
                 jobs: Sequence[ClaimedJob]) -> None:
        pass

    def on_finish(self, job: ClaimedJob, outcome: str, run_seconds: float) -> None:
        pass

    def on_reap(self, queue: str, expired: int, failed: int = 0) -> None:
        pass

    def on_loop(self, healthy: bool) -> None:
        pass

    def on_db_error(self, kind: str) -> None:
        pass

    def on_reconnect(self) -> None:
        pass


__all__ = ["DB_ERROR_KINDS", "FinishedJob", "NullObserver", "WorkerObserver"]
