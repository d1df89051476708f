"""``fairq.Task``: a registered handler, its defaults, and its typed ways to enqueue."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from fairq.errors import InvalidInput
from fairq.job import Job

if TYPE_CHECKING:
    from fairq.app.application import App
    from fairq.app.enqueue import Item

R = TypeVar("R")


@dataclass(frozen=True)
class Task(Generic[R]):
    """A handler registered with ``@app.task`` and its defaults; ``R`` is what the handler
    returns (a coroutine for an ``async def`` handler). Calling the task calls the handler.

    ``task.enqueue(...)`` is ``app.enqueue(task.name, ...)``: the same keywords, checked by a
    type checker here because they are spelled out.
    """

    app: App
    name: str
    fn: Callable[[Job], R]
    queue: str
    max_attempts: int
    lease: int
    priority: int
    cost: float

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def __call__(self, job: Job) -> R:
        return self.fn(job)

    def enqueue(
        self,
        *,
        tenant: str,
        payload: Any = None,
        run_at: datetime | None = None,
        delay: float | timedelta | None = None,
        priority: int | None = None,
        cost: float | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        lease: int | None = None,
        connection: Any = None,
        key: str | None = None,
    ) -> int:
        """Enqueue one job of this task (``App.enqueue``); returns its id."""
        return self.app.enqueue(
            self.name, tenant=tenant, payload=payload, run_at=run_at, delay=delay,
            priority=priority, cost=cost, queue=queue, max_attempts=max_attempts, lease=lease,
            connection=connection, key=key)

    async def enqueue_async(
        self,
        *,
        tenant: str,
        payload: Any = None,
        run_at: datetime | None = None,
        delay: float | timedelta | None = None,
        priority: int | None = None,
        cost: float | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        lease: int | None = None,
        connection: Any = None,
        key: str | None = None,
    ) -> int:
        """``enqueue`` for asyncio (``App.enqueue_async``)."""
        return await self.app.enqueue_async(
            self.name, tenant=tenant, payload=payload, run_at=run_at, delay=delay,
            priority=priority, cost=cost, queue=queue, max_attempts=max_attempts, lease=lease,
            connection=connection, key=key)

    def enqueue_many(
        self,
        items: Iterable[Item],
        *,
        run_at: datetime | None = None,
        delay: float | timedelta | None = None,
        priority: int | None = None,
        cost: float | None = None,
        queue: str | None = None,
        connection: Any = None,
    ) -> list[int]:
        """Enqueue ``(tenant, payload)`` pairs or ``(tenant, payload, key)`` triples of this
        task (``App.enqueue_many``); returns the ids in the items' order."""
        return self.app.enqueue_many(self.name, items, run_at=run_at, delay=delay,
                                     priority=priority, cost=cost, queue=queue,
                                     connection=connection)

    async def enqueue_many_async(
        self,
        items: Iterable[Item],
        *,
        run_at: datetime | None = None,
        delay: float | timedelta | None = None,
        priority: int | None = None,
        cost: float | None = None,
        queue: str | None = None,
        connection: Any = None,
    ) -> list[int]:
        """``enqueue_many`` for asyncio (``App.enqueue_many_async``)."""
        return await self.app.enqueue_many_async(self.name, items, run_at=run_at, delay=delay,
                                                 priority=priority, cost=cost, queue=queue,
                                                 connection=connection)


def default_name(fn: Callable[..., object]) -> str:
    """A task's default name, ``module.qualname``, with the module a worker that imports it finds.

    A script run as ``python app1.py`` is ``__main__`` here but ``app1`` to ``fairq worker
    app1:app``, so its tasks are named after the file (``-m pkg.mod`` after ``pkg.mod``).
    """
    return f"{_module_name(fn)}.{fn.__qualname__}"


def _module_name(fn: Callable[..., object]) -> str:
    module = fn.__module__
    if module != "__main__":
        return module
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name and spec.name != "__main__":
        return str(spec.name).removesuffix(".__main__")
    path = getattr(main, "__file__", None)
    if path and Path(path).suffix == ".py":
        return Path(path).stem
    raise InvalidInput(f"task {fn.__qualname__!r} is defined in __main__ without a file (an "
                       "interactive session?): give it a name, @app.task(name=...), that the "
                       "worker's copy of the code registers too")
