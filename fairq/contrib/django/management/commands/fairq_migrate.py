"""``manage.py fairq_migrate``: fairq's own migrations on the backend's database (docs/django.md
says why these are not Django migrations)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from fairq import migrate
from fairq.contrib.django import conf


class Command(BaseCommand):  # type: ignore[misc]
    help = "Create or upgrade fairq's tables in the database settings.FAIRQ names"

    def handle(self, *args: Any, **options: Any) -> None:
        app = conf.app()
        before = migrate.current(app.dsn, app.schema)
        app.migrate()
        after = migrate.current(app.dsn, app.schema)
        where = f"schema {app.schema}"
        if options.get("verbosity", 1) < 1:
            return
        if before == after:
            self.stdout.write(f"{where} is already at fairq revision {after}: nothing to do")
        else:
            self.stdout.write(f"{where}: fairq revision {before or 'none'} -> {after}")
