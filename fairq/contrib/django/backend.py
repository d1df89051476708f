"""``FairqBackend``: Django's Tasks framework on fairq. A ``@task`` function's ``.enqueue()``
is a fairq job of the task's module path, for a tenant the settings name, inserted on Django's
own database connection (it commits and rolls back with ``transaction.atomic()``); its result
is read back from the job (``get_result``, ``result.refresh()``)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.utils.module_loading import import_string

from fairq.contrib.django import conf
from fairq.contrib.django.compat import (
    BaseTaskBackend,
    InvalidTaskError,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
)
from fairq.errors import InvalidInput
from fairq.models import JobInfo

# OPTIONS: TENANT, a fixed tenant; or TENANT_FROM, the dotted path of a callable
# (task, args, kwargs) -> tenant, e.g. the organisation of the request being served.
OPTION_KEYS = {"TENANT", "TENANT_FROM", "MAX_ATTEMPTS", "LEASE"}
# Django's Tasks have no retries of their own: one attempt unless OPTIONS say more.
DEFAULT_MAX_ATTEMPTS = 1
_STATUS = {"queued": TaskResultStatus.READY, "running": TaskResultStatus.RUNNING,
           "done": TaskResultStatus.SUCCESSFUL, "failed": TaskResultStatus.FAILED,
           "cancelled": TaskResultStatus.FAILED}


class FairqBackend(BaseTaskBackend):  # type: ignore[misc]
    """``TASKS = {"default": {"BACKEND": "fairq.contrib.django.FairqBackend", "OPTIONS":
    {"TENANT_FROM": "myapp.tenancy.current_tenant"}}}`` (docs/django.md)."""

    supports_defer = True
    supports_get_result = True
    supports_priority = True
    supports_async_task = False

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        # Reported by the system checks at start-up (check()); an enqueue refuses with it too.
        self.problems = option_problems(self.options)
        # The queues TASKS names (QUEUES): a task may be enqueued to any of them with
        # .using(queue_name=...), so the worker serves them besides its tasks' own queues.
        self.declared_queues = sorted(params.get("QUEUES") or ())

    # -- configuration ---------------------------------------------------------------------
    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        """Django's system checks (``manage.py check``, runserver, the worker's start): a bad
        option is one line before the first job, not a traceback at it."""
        for problem in conf.problems():  # settings.FAIRQ and its database
            yield checks.Error(problem, id="fairq.E002")
        for problem in self.problems:
            yield checks.Error(f"TASKS[{self.alias!r}]: {problem}", id="fairq.E001")

    @functools.cached_property
    def _tenant_from(self) -> Callable[..., Any] | None:
        path = self.options.get("TENANT_FROM")
        return None if path is None else import_string(path)

    def tenant(self, task: Task, args: list[Any], kwargs: dict[str, Any]) -> str:
        """The tenant of this enqueue: OPTIONS' TENANT, or what TENANT_FROM returns."""
        fn = self._tenant_from
        if fn is None:
            return str(self.options["TENANT"])
        path = self.options["TENANT_FROM"]
        try:
            got = fn(task, args, kwargs)
        except Exception as exc:
            raise InvalidInput(f"TASKS[{self.alias!r}] TENANT_FROM {path} raised "
                               f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(got, str) or not got:
            raise InvalidInput(f"TASKS[{self.alias!r}] TENANT_FROM {path} returned {got!r}, "
                               "not a tenant name")
        return got

    # -- the framework's API ---------------------------------------------------------------
    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        if self.problems:
            raise ImproperlyConfigured(f"TASKS[{self.alias!r}]: {self.problems[0]}")
        self.validate_task(task)
        args, kwargs = list(args), dict(kwargs)
        django_db = connections[conf.database_alias()]
        django_db.ensure_connection()
        # In an atomic block a failed query has broken: Django's own refusal, not the
        # database's "current transaction is aborted" from under it.
        django_db.validate_no_broken_transaction()
        try:
            tenant = self.tenant(task, args, kwargs)
            job_id = conf.app().enqueue(
                task.module_path, tenant=tenant,
                payload={"args": args, "kwargs": kwargs, "backend": self.alias},
                queue=task.queue_name, priority=task.priority, run_at=task.run_after,
                max_attempts=int(self.options.get("MAX_ATTEMPTS", DEFAULT_MAX_ATTEMPTS)),
                lease=int(self.options.get("LEASE", 300)), connection=django_db.connection)
        except InvalidInput as exc:
            message = str(exc)
            if message.startswith("payload "):  # the arguments: say so, and whose
                message = (f"{task.module_path}: the task's arguments must be JSON (the "
                           f"job's payload {message.removeprefix('payload ')})")
            raise InvalidTaskError(message) from exc
        info = conf.app().job(job_id) if not django_db.in_atomic_block else None
        return to_result(task, str(job_id), info, self.alias, args, kwargs)

    def get_result(self, result_id: str) -> TaskResult:
        try:
            job_id = int(result_id)
        except (TypeError, ValueError):
            raise TaskResultDoesNotExist(result_id) from None
        info = conf.app().job(job_id) if job_id > 0 else None
        if info is None or not isinstance(info.payload, dict) or \
                info.payload.get("backend") != self.alias:
            raise TaskResultDoesNotExist(result_id)
        from fairq.contrib.django.registry import django_task

        task = django_task(info.task, self.alias)
        if task is None:
            raise TaskResultDoesNotExist(f"{result_id}: task {info.task!r} is not a task of "
                                         f"backend {self.alias!r} here")
        return to_result(task, result_id, info, self.alias, info.payload.get("args", []),
                         info.payload.get("kwargs", {}))


def option_problems(options: dict[str, Any]) -> list[str]:
    """What is wrong with a backend's OPTIONS, one line each."""
    problems = []
    unknown = sorted(set(options) - OPTION_KEYS)
    if unknown:
        problems.append(f"unknown OPTIONS key(s) {', '.join(unknown)}; fairq's backend knows "
                        f"{', '.join(sorted(OPTION_KEYS))}")
    if ("TENANT" in options) == ("TENANT_FROM" in options):
        problems.append("give OPTIONS exactly one of TENANT (a tenant name) and TENANT_FROM "
                        "(the dotted path of a callable (task, args, kwargs) -> tenant)")
    elif "TENANT_FROM" in options:
        try:
            found = import_string(options["TENANT_FROM"])
        except ImportError as exc:
            problems.append(f"TENANT_FROM {options['TENANT_FROM']!r} does not import: {exc}")
        else:
            if not callable(found):
                problems.append(f"TENANT_FROM {options['TENANT_FROM']!r} is not callable")
    elif not isinstance(options["TENANT"], str) or not options["TENANT"]:
        problems.append(f"TENANT must be a tenant name, not {options['TENANT']!r}")
    for key in ("MAX_ATTEMPTS", "LEASE"):
        if key in options and (isinstance(options[key], bool)
                               or not isinstance(options[key], int) or options[key] < 1):
            problems.append(f"{key} must be an integer >= 1, not {options[key]!r}")
    return problems


def to_result(task: Task, result_id: str, info: JobInfo | None, alias: str, args: list[Any],
              kwargs: dict[str, Any]) -> TaskResult:
    """The framework's ``TaskResult`` of a fairq job (``info`` None: just enqueued, unread)."""
    status = TaskResultStatus.READY if info is None else _STATUS[info.status]
    errors = [] if info is None or info.status not in ("failed", "cancelled") else [TaskError(
        exception_class_path=_exception_path(info.last_error),
        traceback=info.last_error or "cancelled")]
    result = TaskResult(
        task=task, id=result_id, status=status,
        enqueued_at=None if info is None else info.created_at,
        started_at=None if info is None else info.started_at,
        last_attempted_at=None if info is None else info.started_at,
        finished_at=None if info is None else info.finished_at,
        args=args, kwargs=kwargs, backend=alias, errors=errors,
        worker_ids=[] if info is None else [info.locked_by or "fairq"] * info.attempts)
    if info is not None and info.status == "done":
        object.__setattr__(result, "_return_value", info.result)
    return result


def _exception_path(last_error: str | None) -> str:
    """The exception's class path from fairq's ``last_error`` ("ValueError: ..." -> builtins),
    or Exception's when it does not say."""
    head = (last_error or "").split(":", 1)[0].strip()
    if head.isidentifier():
        import builtins

        if isinstance(getattr(builtins, head, None), type):
            return f"builtins.{head}"
    return "builtins.Exception"
