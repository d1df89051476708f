"""A fresh schema for a test: an app pointed at a new, migrated schema, dropped after."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager

from fairq.app import App
from fairq.names import validate_schema_name
from fairq.store.ops import drop_schema


@contextmanager
def fresh_schema(app: App, *, schema: str | None = None) -> Iterator[App]:
    """Point ``app`` (its tasks and periodic schedules kept) at a new schema, migrated, for the
    block; then close its pools, drop the schema and point it back. ``schema`` defaults to a
    random ``fairq_test_...`` name, so tests in parallel processes never share one."""
    name = validate_schema_name(schema or f"fairq_test_{secrets.token_hex(6)}")
    before = app.schema
    app.close()
    app.schema = name
    try:
        app.migrate()
        yield app
    finally:
        app.close()
        try:
            drop_schema(app.dsn, name)
        finally:
            app.schema = before
