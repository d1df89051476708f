"""The Django app that brings the commands (INSTALLED_APPS: ``"fairq.contrib.django"``)."""

from __future__ import annotations

from django.apps import AppConfig


class FairqConfig(AppConfig):  # type: ignore[misc]
    name = "fairq.contrib.django"
    label = "fairq"
    verbose_name = "fairq"

    def ready(self) -> None:
        """Import the Tasks framework: on Django 6 that registers its system check of the task
        backends (``django.tasks.checks``), which nothing else imports before ``manage.py
        check`` runs, so a misspelt OPTIONS key would not be reported at start-up. (Django 5.2's
        ``django_tasks`` app registers it from INSTALLED_APPS.)"""
        from fairq.contrib.django import compat  # noqa: F401
