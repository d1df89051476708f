"""Per-tenant statistics for ``fairq stats``: backlog, caps, outcomes and recent fairness.

Operators ask "is anyone starved, and is the split what the weights say?": the table answers
with each tenant's share of recent claims beside its share of weight, its oldest wait, and why
its next job has not started (the reason of ``fairq tenants explain``, docs/explain.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fairq.store.monitor import tenant_stats as read_tenant_stats

if TYPE_CHECKING:
    from fairq.app import App

DEFAULT_WINDOW_S = 300.0
DEFAULT_TIMEOUT_MS = 10_000


@dataclass(frozen=True, slots=True)
class TenantStats:
    """One (queue, tenant): counts now, and its share of claims vs weight over the window."""

    queue: str
    tenant: str
    due: int
    delayed: int
    running: int
    max_running: int
    weight: float
    done: int
    failed: int
    recent_claims: int
    active: bool
    claim_share: float | None
    weight_share: float | None
    oldest_wait_seconds: float | None
    rate: float | None = None      # its rate limit (jobs per second), None: none
    tokens: float | None = None    # its token bucket now
    tenant_group: str = "default"
    throttled_seconds: float = 0.0  # time spent with a due job and no token, so far
    reason: str = "no_jobs"  # why its next job has not started (docs/explain.md)


def tenant_stats(app: App, *, window_s: float = DEFAULT_WINDOW_S, queue: str | None = None,
                 timeout_ms: int = DEFAULT_TIMEOUT_MS) -> list[TenantStats]:
    """Read the statistics in one bounded, read-only transaction."""
    rows, waits = read_tenant_stats(app.store, window_s=window_s, queue=queue,
                                    timeout_ms=timeout_ms)
    reasons = {(w["queue"], w["tenant"]): str(w["reason"]) for w in waits}
    return [TenantStats(**{**r, "weight": float(r["weight"]),
                           "reason": reasons.get((r["queue"], r["tenant"]), "no_jobs")})
            for r in rows]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = max(0.0, seconds)
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{s / 60:.1f}m"
    if s < 86400:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


HEADERS = ("queue", "tenant", "group", "queued (due/delayed)", "running/cap", "weight", "rate (tokens)",
           "throttled", "done", "failed", "claims", "weight share", "oldest wait", "reason")
RIGHT = (False, False, False, True, True, True, True, True, True, True, True, True, True, False)


def table_rows(stats: Sequence[TenantStats]) -> list[list[str]]:
    """The human table's cells; a cap of 0 shows as 'paused'."""
    return [
        [
            s.queue,
            s.tenant,
            s.tenant_group,
            f"{s.due + s.delayed} ({s.due}/{s.delayed})",
            f"{s.running}/{s.max_running}" if s.max_running > 0 else f"{s.running}/paused",
            f"{s.weight:g}",
            "-" if s.rate is None else f"{s.rate:g}/s ({s.tokens or 0:.1f})",
            "-" if s.rate is None and not s.throttled_seconds else _age(s.throttled_seconds),
            str(s.done),
            str(s.failed),
            f"{_pct(s.claim_share)} ({s.recent_claims})",
            _pct(s.weight_share),
            _age(s.oldest_wait_seconds),
            s.reason,
        ]
        for s in stats
    ]


__all__ = ["DEFAULT_TIMEOUT_MS", "DEFAULT_WINDOW_S", "HEADERS", "RIGHT", "TenantStats",
           "table_rows", "tenant_stats"]
