"""fairq.contrib.django.compat on Django 6, without Django 6 (it needs Python 3.12): a stand-in
``django.tasks`` laid out as Django 6.0 has it (its invalid-task error is named ``InvalidTask``)
must be the framework the backend uses, not a fallback to django-tasks."""

from __future__ import annotations

import importlib
import sys
import types

import pytest

pytest.importorskip("django_tasks", reason="the django extra: pip install -e '.[django]'")

COMPAT = "fairq.contrib.django.compat"


def _django6_stand_in() -> dict[str, types.ModuleType]:
    """``django.tasks`` and its submodules with Django 6.0's names (objects from django-tasks)."""
    import django_tasks
    import django_tasks.backends.base
    import django_tasks.base
    import django_tasks.exceptions

    class InvalidTask(Exception):
        """Django 6's name (django-tasks calls it InvalidTaskError)."""

    modules = {name: types.ModuleType(name) for name in (
        "django.tasks", "django.tasks.backends", "django.tasks.backends.base",
        "django.tasks.base", "django.tasks.exceptions")}
    for attr in ("Task", "TaskContext", "TaskResult", "TaskResultStatus", "task_backends"):
        setattr(modules["django.tasks"], attr, getattr(django_tasks, attr, None)
                or getattr(django_tasks.base, attr))
    modules["django.tasks.backends.base"].BaseTaskBackend = (  # type: ignore[attr-defined]
        django_tasks.backends.base.BaseTaskBackend)
    modules["django.tasks.base"].TaskError = django_tasks.base.TaskError  # type: ignore[attr-defined]
    exceptions = modules["django.tasks.exceptions"]
    exceptions.InvalidTask = InvalidTask  # type: ignore[attr-defined]
    exceptions.TaskResultDoesNotExist = (  # type: ignore[attr-defined]
        django_tasks.exceptions.TaskResultDoesNotExist)
    return modules


def test_django_6s_own_framework_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    import fairq.contrib.django as package

    stand_in = _django6_stand_in()
    for name, module in stand_in.items():
        monkeypatch.setitem(sys.modules, name, module)
    original = sys.modules.pop(COMPAT, None)
    try:
        compat = importlib.import_module(COMPAT)
        assert compat.InvalidTaskError is stand_in["django.tasks.exceptions"].InvalidTask
        assert compat.BaseTaskBackend is stand_in["django.tasks.backends.base"].BaseTaskBackend
    finally:  # the real module back, for every later test of this process
        sys.modules.pop(COMPAT, None)
        if original is not None:
            sys.modules[COMPAT] = original
            monkeypatch.setattr(package, "compat", original, raising=False)
