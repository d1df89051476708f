"""New per-tenant series start at zero, so their first increments show in ``rate()``.

A counter or histogram series that first appears already holding a burst (a tenant's first
claims and waits, all between two scrapes) has no earlier sample to subtract from: ``rate()``
and ``increase()`` see nothing until its next increment, and a small tenant's first waits, the
ones the per-tenant wait panels exist for, never show. So the first time a series is exposed it
is exposed at zero, and with its real value from the next scrape on: the burst then shows as an
increase, one scrape late. A series that goes away (a tenant folded into ``__other__``) and
comes back starts at zero again.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


class FreshSeries:
    """Remembers which series a previous exposition showed (not thread-safe: callers lock)."""

    def __init__(self, label: str = "tenant") -> None:
        self.label = label
        self._shown: set[SeriesKey] = set()

    def zero_new(self, families: Iterable[Metric]) -> list[Metric]:
        """``families`` with every series not shown last time at zero (counters and
        histograms that carry ``label``); gauges and other families pass unchanged."""
        out: list[Metric] = []
        shown: set[SeriesKey] = set()
        for fam in families:
            if fam.type not in ("counter", "histogram"):
                out.append(fam)
                continue
            samples = []
            for s in fam.samples:
                if self.label not in s.labels:
                    samples.append(s)
                    continue
                key = (fam.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "le")))
                shown.add(key)
                samples.append(s if key in self._shown else s._replace(value=0.0))
            fam.samples = samples
            out.append(fam)
        self._shown = shown
        return out
