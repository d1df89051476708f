"""fairq's pytest plugin (loaded by pytest through the ``pytest11`` entry point when fairq is
installed; it only adds fixtures and one ini option, so loading it changes nothing else).

- ``fairq_app``: the app a test uses, on a fresh migrated schema dropped after the test. It is
  the app named by the ini option ``fairq_app = "package.module:app"`` (its tasks kept), or a
  bare ``fairq.App()``. The database is ``$FAIRQ_DATABASE_URL``, else the embedded server.
- ``fairq_connection``: a psycopg connection to the same database inside an open transaction,
  rolled back after the test: enqueue with ``connection=fairq_connection`` and assert with
  ``fairq.testing.assert_enqueued(app, ..., connection=fairq_connection)`` before any commit.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import pytest

from fairq.app import App
from fairq.errors import InvalidInput
from fairq.store.testing import rolled_back
from fairq.testing.schema import fresh_schema

INI = "fairq_app"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(INI, "the fairq.App the fairq_app fixture uses, as package.module:attribute "
                       "(default: a bare fairq.App())", default="")


def load_app(spec: str) -> App:
    """The ``App`` that ``package.module:attribute`` names; one clear line when it does not."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise InvalidInput(f"{INI} = {spec!r}: write it as package.module:attribute")
    try:
        found: Any = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise InvalidInput(f"{INI} = {spec!r} cannot be loaded: {exc}") from None
    if not isinstance(found, App):
        raise InvalidInput(f"{INI} = {spec!r} is a {type(found).__name__}, not a fairq.App")
    return found


@pytest.fixture
def fairq_app(request: pytest.FixtureRequest) -> Iterator[App]:
    """The test's app on a fresh schema (see the module's docstring)."""
    spec = str(request.config.getini(INI) or "").strip()
    app = load_app(spec) if spec else App()
    with fresh_schema(app) as fresh:
        yield fresh


@pytest.fixture
def fairq_connection(fairq_app: App) -> Iterator[Any]:
    """A connection in an open transaction on the test app's database, rolled back after."""
    with rolled_back(fairq_app.dsn) as conn:
        yield conn
