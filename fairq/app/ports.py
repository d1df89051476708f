"""What the parts of ``fairq.app`` need of each other, as protocols: a ``Task`` needs
something that enqueues by name, making a job needs a task's defaults, ``Tenants`` and
``Groups`` need the stores, and ``App`` hands validated jobs to a ``JobSink``. The store-backed
sink is that one's default and the test mode's inline sink (``fairq.testing``) another, so no
module here imports ``App`` and the test mode needs no special case in it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from typing_extensions import Unpack

from fairq.app.options import EnqueueOptions, Item, ManyOptions
from fairq.models import NewJobColumns, TraceContext

if TYPE_CHECKING:
    from fairq.store import Store
    from fairq.store.aio import AsyncStore


class TaskDefaults(Protocol):
    """A registered task's defaults for its jobs (``fairq.Task`` has them)."""

    @property
    def queue(self) -> str: ...

    @property
    def priority(self) -> int: ...

    @property
    def cost(self) -> float: ...

    @property
    def max_attempts(self) -> int: ...

    @property
    def lease(self) -> int: ...


class Enqueuer(Protocol):
    """Enqueues jobs of a task by its name: what a ``Task``'s own ``enqueue`` methods call."""

    def enqueue(self, task: str, *, tenant: str, **options: Unpack[EnqueueOptions]) -> int: ...

    async def enqueue_async(self, task: str, *, tenant: str,
                            **options: Unpack[EnqueueOptions]) -> int: ...

    def enqueue_many(self, task: str, items: Iterable[Item],
                     **options: Unpack[ManyOptions]) -> list[int]: ...

    async def enqueue_many_async(self, task: str, items: Iterable[Item],
                                 **options: Unpack[ManyOptions]) -> list[int]: ...


class Stores(Protocol):
    """The stores of an app (``Tenants`` and ``Groups`` read and write through them)."""

    @property
    def store(self) -> Store: ...

    @property
    def astore(self) -> AsyncStore: ...


class JobSink(Protocol):
    """Where validated jobs go: ids back in their order. ``connection`` is the caller's (None:
    the sink's own transaction); ``trace`` is the enqueue's trace context, stored with every
    job of the call (None: none)."""

    def put(self, chunks: Iterator[NewJobColumns], *, connection: Any,
            trace: TraceContext | None) -> list[int]: ...

    async def put_async(self, jobs: NewJobColumns, *, connection: Any,
                        trace: TraceContext | None) -> list[int]: ...
