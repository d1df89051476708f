"""The Django tasks a worker runs: found by importing each installed app's ``tasks`` module
(and ``settings.FAIRQ["TASK_MODULES"]``) and keeping the ``Task`` objects of this backend, never
by importing a path a job names. Each becomes a fairq task of the worker's own App."""

from __future__ import annotations

import functools
import importlib
from typing import Any

from django.apps import apps
from django.db import close_old_connections

import fairq
from fairq.contrib.django import conf
from fairq.contrib.django.compat import Task, TaskContext, TaskResultStatus


@functools.cache
def discover(alias: str) -> dict[str, Task]:
    """This backend's Django tasks by module path (the fairq task name)."""
    modules = [f"{config.name}.tasks" for config in apps.get_app_configs()]
    imported = []
    for name in modules + conf.fairq_settings()["TASK_MODULES"]:
        try:
            imported.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            if exc.name != name:  # the module exists and one of its imports failed
                raise
    found: dict[str, Task] = {}
    for module in imported:  # only these: another module's lazy objects may not be touched
        for value in list(vars(module).values()):
            if isinstance(value, Task) and value.backend == alias:
                found[value.module_path] = value
    return found


def django_task(name: str, alias: str) -> Task | None:
    return discover(alias).get(name)


def worker_app(alias: str) -> fairq.App:
    """A fairq App on the backend's database whose tasks are this backend's Django tasks."""
    base = conf.app()
    app = fairq.App(base.dsn, schema=base.schema)
    for name, task in sorted(discover(alias).items()):
        app.task(name=name, queue=task.queue_name)(_handler(task, alias))
    return app


def _handler(task: Task, alias: str) -> Any:
    def run(job: fairq.Job) -> Any:
        payload = job.payload if isinstance(job.payload, dict) else {}
        if payload.get("backend") != alias:
            raise fairq.InvalidInput(f"job {job.id} is not a job of task backend {alias!r}")
        args, kwargs = list(payload.get("args", [])), dict(payload.get("kwargs", {}))
        close_old_connections()  # the ORM in a slot thread: no connection outlives its job
        try:
            if task.takes_context:
                from fairq.contrib.django.backend import to_result

                result = to_result(task, str(job.id), None, alias, args, kwargs)
                object.__setattr__(result, "status", TaskResultStatus.RUNNING)
                result.worker_ids.extend(["fairq"] * job.attempt)
                return task.call(TaskContext(task_result=result), *args, **kwargs)
            return task.call(*args, **kwargs)
        finally:
            close_old_connections()

    run.__name__ = run.__qualname__ = task.name
    return run
