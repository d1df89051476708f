"""Charts drawn on the server as SVG (no script, no chart library): a tenant's wait and share
of claims over time, as coordinates a template puts in an ``<svg>``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

WIDTH, HEIGHT = 640, 180
LEFT, RIGHT, TOP, BOTTOM = 48, 48, 12, 24


@dataclass(frozen=True, slots=True)
class Series:
    """One line: its name, its SVG points, and the scale's top value."""

    name: str
    points: str
    top: float
    unit: str
    dots: tuple[tuple[float, float], ...] = ()  # each point, drawn too: one point is no line


@dataclass(frozen=True, slots=True)
class Chart:
    width: int
    height: int
    series: tuple[Series, ...]
    x_labels: tuple[tuple[float, str], ...]   # (x, text)
    empty: bool


def _nice(top: float) -> float:
    """A round scale top at or above ``top``."""
    if top <= 0:
        return 1.0
    step = 10.0 ** math.floor(math.log10(top))
    for m in (1, 2, 2.5, 5, 10):
        if m * step >= top:
            return round(m * step, 12)
    return top


def _xy(values: Sequence[float | None], top: float) -> tuple[tuple[float, float], ...]:
    n = len(values)
    span_x = WIDTH - LEFT - RIGHT
    span_y = HEIGHT - TOP - BOTTOM
    out = []
    for i, v in enumerate(values):
        if v is None:
            continue
        x = LEFT + (span_x * i / (n - 1) if n > 1 else span_x / 2)
        y = TOP + span_y * (1 - min(max(v, 0.0), top) / top)
        out.append((round(x, 1), round(y, 1)))
    return tuple(out)


def _series(name: str, values: Sequence[float | None], top: float, unit: str) -> Series:
    dots = _xy(values, top)
    return Series(name, " ".join(f"{x},{y}" for x, y in dots), top, unit, dots)


def wait_and_share(times: Sequence[str], waits: Sequence[float | None],
                   shares: Sequence[float | None]) -> Chart:
    """The tenant page's chart: mean wait (seconds, left scale) and share of claims (percent,
    right scale) per time bucket; a bucket without claims has no point."""
    wait_top = _nice(max((w for w in waits if w is not None), default=0.0))
    pct = [None if s is None else 100 * s for s in shares]
    n = len(times)
    step = max(1, n // 6)
    span_x = WIDTH - LEFT - RIGHT
    labels = tuple((LEFT + (span_x * i / (n - 1) if n > 1 else 0), times[i])
                   for i in range(0, n, step))
    empty = all(w is None for w in waits) and all(s is None for s in shares)
    return Chart(WIDTH, HEIGHT, (_series("wait", waits, wait_top, "s"),
                                 _series("share", pct, 100.0, "%")), labels, empty)
