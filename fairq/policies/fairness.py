"""Fairness measures, pure maths: used by tests, benchmarks, the exporter and ``fairq stats``."""

from __future__ import annotations

from collections.abc import Mapping


def jain_index(values: list[float]) -> float:
    """Jain's index (sum x)^2 / (n * sum x^2): 1.0 when all equal, 1/n when one takes all."""
    if not values:
        return 1.0
    total = sum(values)
    squares = sum(v * v for v in values)
    if squares == 0:
        return 1.0
    return total * total / (len(values) * squares)


def normalised_service(service: Mapping[str, float], weights: Mapping[str, float]) -> list[float]:
    """Service per unit weight for each tenant in ``service``: the quantity fairness equalises."""
    return [service[t] / weights.get(t, 1.0) for t in service]


def max_share_error(service: Mapping[str, float], weights: Mapping[str, float]) -> float:
    """Max over tenants of |share of service - share of weight| (0 is perfect)."""
    total = sum(service.values())
    wsum = sum(weights.get(t, 1.0) for t in service)
    if total <= 0 or wsum <= 0:
        return 0.0
    return max(abs(service[t] / total - weights.get(t, 1.0) / wsum) for t in service)
