"""``fairq.Task``: a registered handler, its defaults, and its typed ways to enqueue."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from typing_extensions import Unpack

from fairq.app.options import EnqueueOptions, Item, ManyOptions
from fairq.app.ports import Enqueuer
from fairq.errors import InvalidInput
from fairq.job import Job

R = TypeVar("R")


@dataclass(frozen=True)
class Task(Generic[R]):
    """A handler registered with ``@app.task`` and its defaults; ``R`` is what the handler
    returns (a coroutine for an ``async def`` handler). Calling the task calls the handler.

    ``task.enqueue(...)`` is ``app.enqueue(task.name, ...)``: the same keywords
    (``fairq.app.options``), checked by a type checker. ``app`` is the app that registered it,
    seen through what a task needs of it (``fairq.app.ports.Enqueuer``).
    """

    app: Enqueuer
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

    def enqueue(self, *, tenant: str, **options: Unpack[EnqueueOptions]) -> int:
        """Enqueue one job of this task (``App.enqueue``); returns its id."""
        return self.app.enqueue(self.name, tenant=tenant, **options)

    async def enqueue_async(self, *, tenant: str, **options: Unpack[EnqueueOptions]) -> int:
        """``enqueue`` for asyncio (``App.enqueue_async``)."""
        return await self.app.enqueue_async(self.name, tenant=tenant, **options)

    def enqueue_many(self, items: Iterable[Item], **options: Unpack[ManyOptions]) -> list[int]:
        """Enqueue ``(tenant, payload)`` pairs or ``(tenant, payload, key)`` triples of this
        task (``App.enqueue_many``); returns the ids in the items' order."""
        return self.app.enqueue_many(self.name, items, **options)

    async def enqueue_many_async(self, items: Iterable[Item],
                                 **options: Unpack[ManyOptions]) -> list[int]:
        """``enqueue_many`` for asyncio (``App.enqueue_many_async``)."""
        return await self.app.enqueue_many_async(self.name, items, **options)


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
