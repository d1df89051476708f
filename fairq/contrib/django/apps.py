"""The Django app that brings the commands (INSTALLED_APPS: ``"fairq.contrib.django"``)."""

from __future__ import annotations

from django.apps import AppConfig


class FairqConfig(AppConfig):  # type: ignore[misc]
    name = "fairq.contrib.django"
    label = "fairq"
    verbose_name = "fairq"
