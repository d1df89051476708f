"""The bounded label values of the worker metrics: which tenants (queues, tasks) keep series of
their own, and ``tenant="__other__"`` for the rest (docs/metrics.md). The exporter folds its
tenants under the same limit (``max_tenants_from_env``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

OTHER = "__other__"
ENV_MAX_TENANTS = "FAIRQ_METRICS_MAX_TENANTS"


def max_tenants_from_env(default: int = 50) -> int:
    """``$FAIRQ_METRICS_MAX_TENANTS`` as an int >= 0; garbage is ``InvalidInput`` (CLI exit 2),
    not a silent default, so a typo cannot quietly change the metrics' cardinality."""
    from fairq.errors import InvalidInput

    raw = os.environ.get(ENV_MAX_TENANTS, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidInput(f"{ENV_MAX_TENANTS} must be an integer >= 0, not {raw[:40]!r}") from None
    if not 0 <= value <= 1_000_000:
        raise InvalidInput(f"{ENV_MAX_TENANTS} must be between 0 and 1000000, not {value}")
    return value


class TenantFold:
    """Which tenants keep their own series: the top ``limit`` by decayed recent activity.

    Scores decay by half every ``rerank_seconds``; a job claimed adds 1 plus its wait in seconds
    (a tenant whose jobs wait long matters even when it is small), an enqueue or finish adds 1.
    Not thread-safe on its own: callers hold their lock.
    """

    def __init__(self, limit: int, rerank_seconds: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.rerank_seconds = rerank_seconds
        self.clock = clock
        self.live: set[str] = set()
        self.score: dict[str, float] = {}
        self.folded_seen: set[str] = set()  # tenants folded since the last re-rank
        self._next = clock() + rerank_seconds

    def label(self, tenant: str, activity: float) -> str:
        """Record ``activity`` for ``tenant`` and return the label value its series use now."""
        self.score[tenant] = self.score.get(tenant, 0.0) + activity
        if tenant in self.live:
            return tenant
        if len(self.live) < self.limit:
            self.live.add(tenant)
            return tenant
        self.folded_seen.add(tenant)
        return OTHER

    def due(self) -> bool:
        return self.clock() >= self._next

    def rerank(self) -> set[str]:
        """Decay scores, pick the new top set; returns the demoted tenants (drop their series)."""
        now = self.clock()
        periods = max(1.0, (now - self._next) / self.rerank_seconds + 1.0)
        self._next = now + self.rerank_seconds
        factor = 0.5 ** periods
        # Forget tenants whose activity has decayed to nothing: bounded memory, and an idle
        # tenant's series do not stay forever even while there is room.
        self.score = {t: s * factor for t, s in self.score.items() if s * factor >= 0.01}
        # Members get a 25% bonus: a tenant near the cut does not flap in and out.
        ranked = sorted(self.score,
                        key=lambda t: (-self.score[t] * (1.25 if t in self.live else 1.0), t))
        top = set(ranked[: self.limit])
        demoted = self.live - top
        self.live = top
        self.folded_seen = {t for t in self.score if t not in self.live}
        return demoted

    @property
    def folded(self) -> int:
        return len(self.folded_seen - self.live)
