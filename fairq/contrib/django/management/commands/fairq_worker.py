"""``manage.py fairq_worker``: a fairq worker running this project's Django tasks of one task
backend, with ``settings.FAIRQ["WORKER"]``'s options (the command line's win)."""

from __future__ import annotations

import logging
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from fairq.contrib.django import conf
from fairq.contrib.django.compat import task_backends
from fairq.errors import InvalidInput


class Command(BaseCommand):  # type: ignore[misc]
    help = "Run a fairq worker for this project's Django tasks (SIGTERM stops it gracefully)"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", default="default", help="the TASKS alias (default)")
        parser.add_argument("--concurrency", type=int, help="handler slots (default 8)")
        parser.add_argument("--queues", nargs="+", help="queues to claim from (default: the "
                            "tasks' queues and TASKS' QUEUES)")
        parser.add_argument("--policy", help="claim policy (default weighted)")
        parser.add_argument("--until-empty", action="store_true",
                            help="stop once nothing is runnable (tests, one-off drains)")

    def handle(self, *args: Any, **options: Any) -> None:
        from fairq.contrib.django.registry import discover, worker_app

        alias = options["backend"]
        try:
            backend = task_backends[alias]
        except Exception as exc:
            raise CommandError(f"task backend {alias!r}: {exc}") from None
        if type(backend).__name__ != "FairqBackend":
            raise CommandError(f"TASKS[{alias!r}] is {type(backend).__name__}, not "
                               "fairq.contrib.django.FairqBackend")
        settings = dict(conf.fairq_settings()["WORKER"])
        for key in ("concurrency", "queues", "policy"):
            if options.get(key) is not None:
                settings[key] = options[key]
        tasks = discover(alias)
        if not tasks:
            raise CommandError(f"no @task functions of backend {alias!r} found (in each app's "
                               "tasks.py, or settings.FAIRQ['TASK_MODULES'])")
        if settings.get("queues") is None and backend.declared_queues:
            # TASKS' QUEUES too: a job sent to one with .using(queue_name=...) is not stranded.
            settings["queues"] = sorted({*backend.declared_queues,
                                         *(task.queue_name for task in tasks.values())})
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                            "%(message)s")
        app = worker_app(alias)
        try:
            worker = app.worker(**settings)
        except (InvalidInput, TypeError) as exc:
            raise CommandError(f"worker options: {exc}") from None
        try:
            worker.run(until_empty=options["until_empty"])
        finally:
            app.close()
