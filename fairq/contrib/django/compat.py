"""Django's Tasks framework, where it lives: ``django.tasks`` from Django 6, the ``django-tasks``
package (``django_tasks``) on Django 5.2, the same API."""

from __future__ import annotations

try:  # Django 6 (its InvalidTask is django-tasks' InvalidTaskError: one name here)
    from django.tasks import (  # type: ignore[import-not-found,unused-ignore]
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task_backends,
    )
    from django.tasks.backends.base import (  # type: ignore[import-not-found,unused-ignore]
        BaseTaskBackend,
    )
    from django.tasks.base import TaskError  # type: ignore[import-not-found,unused-ignore]
    from django.tasks.exceptions import (  # type: ignore[import-not-found,unused-ignore]
        InvalidTask as InvalidTaskError,
    )
    from django.tasks.exceptions import (  # type: ignore[import-not-found,unused-ignore]
        TaskResultDoesNotExist,
    )
except ImportError:
    try:
        from django_tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskError
        from django_tasks.exceptions import InvalidTaskError, TaskResultDoesNotExist
    except ImportError as exc:
        raise ImportError("fairq.contrib.django needs Django's Tasks framework (Django 6, or "
                          "Django 5.2 with django-tasks): pip install 'fairq[django]'") from exc

__all__ = ["BaseTaskBackend", "InvalidTaskError", "Task", "TaskContext", "TaskError",
           "TaskResult", "TaskResultDoesNotExist", "TaskResultStatus", "task_backends"]
