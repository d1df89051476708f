"""The seam between the worker runtime and whatever watches it (Prometheus, tests, logs).

The worker calls these hooks; it never imports prometheus-client itself. ``NullObserver`` is
the default; ``fairq.metrics.PrometheusObserver`` is the one ``--metrics-port`` installs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from fairq.models import ClaimedJob, FinishedJob


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


__all__ = ["FinishedJob", "NullObserver", "WorkerObserver"]
