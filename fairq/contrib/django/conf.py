"""``settings.FAIRQ``: which database and schema fairq uses, and the worker's options.

    FAIRQ = {
        "DATABASE": "default",        # the DATABASES alias jobs are enqueued on (and read from)
        "SCHEMA": "fairq",            # fairq's schema in that database
        "WORKER": {"concurrency": 8},  # fairq.runtime.WorkerSettings, for manage.py fairq_worker
        "TASK_MODULES": [],           # modules with @task functions beyond each app's tasks.py
    }

Everything is optional. The fairq App is made once per process from these settings and the
database's own connection settings (``DATABASES[alias]``), so fairq never needs a URL of its own.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

import fairq
from fairq.config import resolve_schema
from fairq.errors import InvalidInput

KEYS = {"DATABASE", "SCHEMA", "WORKER", "TASK_MODULES"}
# DATABASES[alias] -> libpq keyword: what fairq's own connections (its worker, results) need.
_LIBPQ = {"NAME": "dbname", "USER": "user", "PASSWORD": "password", "HOST": "host",
          "PORT": "port"}
_LIBPQ_OPTIONS = {"sslmode", "sslrootcert", "sslcert", "sslkey", "connect_timeout",
                  "target_session_attrs", "application_name", "service", "passfile"}


def fairq_settings() -> dict[str, Any]:
    """``settings.FAIRQ``, checked: a key fairq does not know is one clear line."""
    given = getattr(settings, "FAIRQ", None) or {}
    if not isinstance(given, dict):
        raise ImproperlyConfigured(f"settings.FAIRQ must be a dict, not {type(given).__name__}")
    unknown = sorted(set(given) - KEYS)
    if unknown:
        raise ImproperlyConfigured(f"settings.FAIRQ: unknown key(s) {', '.join(unknown)}; "
                                   f"fairq knows {', '.join(sorted(KEYS))}")
    alias = given.get("DATABASE", "default")
    if alias not in settings.DATABASES:
        raise ImproperlyConfigured(f"settings.FAIRQ DATABASE {alias!r} is not in DATABASES")
    if not isinstance(given.get("WORKER", {}), dict):
        raise ImproperlyConfigured("settings.FAIRQ WORKER must be a dict of worker options")
    return {"DATABASE": alias, "SCHEMA": given.get("SCHEMA"), "WORKER": given.get("WORKER", {}),
            "TASK_MODULES": list(given.get("TASK_MODULES", []))}


def database_alias() -> str:
    return str(fairq_settings()["DATABASE"])


def conninfo(alias: str) -> str:
    """A libpq connection string for ``DATABASES[alias]`` as Django connects to it now (a
    test run's test database included)."""
    problem = database_problem(alias)
    if problem:
        raise ImproperlyConfigured(problem)
    db = connections[alias].settings_dict
    pairs = {key: db.get(name) for name, key in _LIBPQ.items()}
    pairs.update({k: v for k, v in (db.get("OPTIONS") or {}).items() if k in _LIBPQ_OPTIONS})
    return " ".join(f"{k}='{_quoted(v)}'" for k, v in pairs.items() if v not in (None, ""))


def database_problem(alias: str) -> str | None:
    """Why fairq cannot use ``DATABASES[alias]`` (None: it can): fairq needs PostgreSQL (any
    engine of that vendor, PostGIS too) on psycopg 3, whose connection a job is written on."""
    db = connections[alias]
    if db.vendor != "postgresql":
        return (f"fairq needs PostgreSQL: DATABASES[{alias!r}] uses "
                f"{db.settings_dict.get('ENGINE')!r}")
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if not is_psycopg3:
        return (f"fairq needs psycopg 3: DATABASES[{alias!r}] runs on psycopg2, whose "
                "connection fairq cannot write a job on (pip install 'psycopg[binary]')")
    return None


def problems() -> list[str]:
    """What is wrong with ``settings.FAIRQ`` and the database it names, one line each: for
    the system checks, so that none of it waits for the first job or the worker's start."""
    try:
        conf = fairq_settings()
    except ImproperlyConfigured as exc:
        return [str(exc)]
    found = []
    problem = database_problem(conf["DATABASE"])
    if problem:
        found.append(problem)
    try:
        resolve_schema(conf["SCHEMA"])
    except InvalidInput as exc:
        found.append(f"settings.FAIRQ SCHEMA: {exc}")
    from fairq.runtime import WorkerSettings

    known = {f.name for f in dataclasses.fields(WorkerSettings)}
    unknown = sorted(set(conf["WORKER"]) - known)
    if unknown:
        found.append(f"settings.FAIRQ WORKER: unknown option(s) {', '.join(unknown)}; the "
                     f"worker takes {', '.join(sorted(known))}")
    else:
        try:
            WorkerSettings(**conf["WORKER"])
        except (InvalidInput, TypeError) as exc:
            found.append(f"settings.FAIRQ WORKER: {exc}")
    return found


def _quoted(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("'", "\\'")


@functools.cache
def app() -> fairq.App:
    """This process's fairq App on Django's database (made on first use, kept)."""
    conf = fairq_settings()
    return fairq.App(conninfo(conf["DATABASE"]), schema=conf["SCHEMA"])
