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

import functools
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

import fairq

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
    db = connections[alias].settings_dict
    if db.get("ENGINE") != "django.db.backends.postgresql":
        raise ImproperlyConfigured(f"fairq needs PostgreSQL: DATABASES[{alias!r}] uses "
                                   f"{db.get('ENGINE')!r}")
    pairs = {key: db.get(name) for name, key in _LIBPQ.items()}
    pairs.update({k: v for k, v in (db.get("OPTIONS") or {}).items() if k in _LIBPQ_OPTIONS})
    return " ".join(f"{k}='{_quoted(v)}'" for k, v in pairs.items() if v not in (None, ""))


def _quoted(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("'", "\\'")


@functools.cache
def app() -> fairq.App:
    """This process's fairq App on Django's database (made on first use, kept)."""
    conf = fairq_settings()
    return fairq.App(conninfo(conf["DATABASE"]), schema=conf["SCHEMA"])
