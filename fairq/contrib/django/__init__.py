"""fairq for Django's Tasks framework (docs/django.md): ``FairqBackend``, and the commands
``manage.py fairq_worker`` and ``manage.py fairq_migrate`` once ``"fairq.contrib.django"`` is
in INSTALLED_APPS."""

from __future__ import annotations

from typing import Any

__all__ = ["FairqBackend", "close_connections"]


def close_connections() -> None:
    """Close fairq's own connections of this process (its results' and migrations' pool), as
    a test run must before Django drops its test database."""
    from fairq.contrib.django import conf

    if conf.app.cache_info().currsize:
        conf.app().close()


def __getattr__(name: str) -> Any:  # Django is imported when the backend is asked for
    if name == "FairqBackend":
        from fairq.contrib.django.backend import FairqBackend

        return FairqBackend
    raise AttributeError(name)
