"""Hooks around each attempt a worker runs (``App.attempt_hooks``): a hook takes the ``Job``
and returns a context manager entered around its handler, which sees the handler's exception
(``fairq.otel`` runs each attempt in a span this way). The runtime knows nothing of them: the
app hands the worker its tasks with their handlers wrapped."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack
from typing import Any

from fairq.app.task import Task
from fairq.job import Job

AttemptHook = Callable[[Job], AbstractContextManager[object]]


def with_hooks(tasks: Mapping[str, Task[Any]],
               hooks: Sequence[AttemptHook]) -> Mapping[str, Task[Any]]:
    """``tasks`` whose handlers run inside every hook (the first hook outermost); ``tasks``
    itself when there are none: no hook, no cost."""
    if not hooks:
        return tasks
    return {name: dataclasses.replace(t, fn=_wrapped(t, tuple(hooks))) for name, t in tasks.items()}


def _wrapped(task: Task[Any], hooks: tuple[AttemptHook, ...]) -> Callable[[Job], Any]:
    fn = task.fn
    if task.is_async:
        @functools.wraps(fn)
        async def run_async(job: Job) -> Any:
            with ExitStack() as stack:
                for hook in hooks:
                    stack.enter_context(hook(job))
                return await fn(job)

        return run_async

    @functools.wraps(fn)
    def run(job: Job) -> Any:
        with ExitStack() as stack:
            for hook in hooks:
                stack.enter_context(hook(job))
            return fn(job)

    return run
