"""Enqueue's keyword options, defined once: ``App`` and ``Task``, sync and async, one job or
many, the test mode and the Django backend all take these (``**options: Unpack[...]``), so a
type checker sees every keyword and a misspelled one is one clear line at run time too."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, TypeAlias, TypedDict

from fairq.errors import InvalidInput

# One ``enqueue_many`` item: (tenant, payload) or (tenant, payload, key).
Item: TypeAlias = tuple[str, Any] | tuple[str, Any, str | None]


class ManyOptions(TypedDict, total=False):
    """What ``enqueue_many`` takes besides its items: the options every job of the call shares.

    ``connection``: a psycopg connection (or a SQLAlchemy connection or session) whose
    transaction the jobs join; they commit or roll back with it (docs/producers.md).
    """

    run_at: datetime | None
    delay: float | timedelta | None
    priority: int | None
    cost: float | None
    queue: str | None
    connection: Any


class EnqueueOptions(ManyOptions, total=False):
    """What ``enqueue`` takes besides the task and tenant: ``ManyOptions``, the payload, the
    task's defaults to override for this job, and an idempotency ``key``."""

    payload: Any
    max_attempts: int | None
    lease: int | None
    key: str | None


MANY_OPTIONS = frozenset(ManyOptions.__annotations__)
ENQUEUE_OPTIONS = frozenset(EnqueueOptions.__annotations__) | MANY_OPTIONS


def check_options(options: dict[str, Any], allowed: frozenset[str], call: str) -> None:
    """Refuse a keyword ``call`` does not take with one line naming the ones it does (Python's
    own TypeError would not be ``InvalidInput``, and ``**options`` accepts anything)."""
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise InvalidInput(f"{call}: unknown option{'s' if len(unknown) > 1 else ''} "
                           f"{', '.join(map(repr, unknown))}; it takes "
                           f"{', '.join(sorted(allowed))}")
