"""A fixed-bucket histogram accumulator: what the observer and the claim probe keep between
scrapes, rendered as prometheus-client's cumulative buckets."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence


class Hist:
    """A fixed-bucket histogram accumulator (not thread-safe: the observer's lock guards it)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += n
        self.sum += value * n

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative buckets as prometheus-client wants them, ending with +Inf."""
        out, acc = [], 0
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            acc += count
            out.append((_le(bound), float(acc)))
        return out


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))
