"""The former home of the worker runtime, now ``fairq.runtime``: these names stay importable
from here."""

from fairq.runtime import (
    DEFAULT_MAX_BATCH,
    MAX_CONCURRENCY,
    MAX_SECONDS,
    StoreFactory,
    Worker,
    WorkerSettings,
    WorkerStats,
    describe_error,
)

__all__ = ["DEFAULT_MAX_BATCH", "MAX_CONCURRENCY", "MAX_SECONDS", "StoreFactory", "Worker",
           "WorkerSettings", "WorkerStats", "describe_error"]
