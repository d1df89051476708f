"""Named SQL statements, loaded once from the ``.sql`` files beside this module.

A file holds blocks that start with ``-- name: NAME``. ``{schema}`` in a statement is replaced by
the quoted schema identifier (validated first); everything else reaches PostgreSQL as bound
parameters. The rendered text is cached per schema, so psycopg's prepared-statement cache sees
one stable text per statement.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

from psycopg import sql

from fairq.schema import validate_schema_name

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


@cache
def _raw() -> dict[str, str]:
    """Every named statement of every ``.sql`` file in this package, unrendered."""
    found: dict[str, str] = {}
    for entry in sorted(resources.files(__package__).iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        text = entry.read_text(encoding="utf-8")
        marks = list(_NAME.finditer(text))
        for i, mark in enumerate(marks):
            end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
            body = text[mark.end():end].strip()
            name = mark.group(1)
            if name in found:
                raise RuntimeError(f"SQL statement {name!r} is defined twice")
            found[name] = body.rstrip(";").strip()
    return found


def names() -> list[str]:
    """The names of all statements."""
    return sorted(_raw())


@cache
def statement(name: str, schema: str) -> str:
    """The statement ``name`` rendered for ``schema``: ready for ``cursor.execute``."""
    body = _raw()[name]
    rendered = sql.SQL(body).format(schema=sql.Identifier(validate_schema_name(schema)))
    return rendered.as_string(None)
