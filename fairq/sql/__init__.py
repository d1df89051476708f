"""Named SQL statements, loaded once from the ``.sql`` files beside this module.

A file holds blocks that start with ``-- name: NAME``. ``{schema}`` in a statement is replaced by
the quoted schema identifier (validated first); everything else reaches PostgreSQL as bound
parameters. The rendered text is cached per schema, so psycopg's prepared-statement cache sees
one stable text per statement.

The comments stay in the files, not in what is sent: psycopg caches the parsing of a query's
placeholders only for texts up to 4 KiB, and a longer text is parsed again in Python at every
execution. Each sent statement starts with a one-line label, ``-- fairq NAME``, so
pg_stat_statements and pg_stat_activity still tell the statements apart.

The claim statements, run at every claim, are sent in the form psycopg would send them, ``$1``,
``$2`` ..., converted here once per schema (``positional``) and executed through psycopg's
RawCursor, so their length never costs that parse.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from psycopg import sql

from fairq.names import validate_schema_name

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
# psycopg's placeholders: %(name)s (and %(name)b / %(name)t, which a RawCursor cannot express),
# %% for a literal %, and anything else after a % (an error, as in psycopg).
_PLACEHOLDER = re.compile(r"%\(([a-z_][a-z0-9_]*)\)([sbt])|%%|%.?", re.DOTALL)


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
            found[name] = _compact(name, body.rstrip(";").strip())
    return found


def _compact(name: str, body: str) -> str:
    """``body`` without comments, indentation and blank lines, under the label ``-- fairq NAME``.

    A small scanner, not a regex, so that ``--`` and spaces inside a quoted literal or identifier
    stay. Literals spanning lines and dollar quoting are refused (the statements have none, and
    the scanner would change them).
    """
    if "$$" in body:
        raise RuntimeError(f"SQL statement {name!r}: dollar quoting is not supported here")
    out: list[str] = []
    quote = ""
    i = 0
    while i < len(body):
        ch = body[i]
        i += 1
        if quote:
            if ch == "\n":
                raise RuntimeError(f"SQL statement {name!r}: a quoted text spans lines")
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "-" and body.startswith("-", i):
            end = body.find("\n", i)
            i = len(body) if end < 0 else end
            continue
        elif ch in " \t":
            if out and out[-1] not in " \n":
                out.append(" ")
            continue
        elif ch == "\n":
            while out and out[-1] == " ":
                out.pop()
            if out and out[-1] != "\n":
                out.append("\n")
            continue
        out.append(ch)
    if quote:
        raise RuntimeError(f"SQL statement {name!r}: unterminated quote")
    return f"-- fairq {name}\n" + "".join(out).strip()


def names() -> list[str]:
    """The names of all statements."""
    return sorted(_raw())


@cache
def statement(name: str, schema: str) -> str:
    """The statement ``name`` rendered for ``schema``: ready for ``cursor.execute``."""
    body = _raw()[name]
    rendered = sql.SQL(body).format(schema=sql.Identifier(validate_schema_name(schema)))
    return rendered.as_string(None)


@dataclass(frozen=True)
class Positional:
    """A statement with ``$n`` placeholders and the parameter name each number stands for."""

    text: str
    names: tuple[str, ...]

    def values(self, params: Mapping[str, Any]) -> list[Any]:
        """``params`` in placeholder order, for ``RawCursor.execute``."""
        return [params[name] for name in self.names]


def to_positional(text: str) -> Positional:
    """``text`` with each ``%(name)s`` as ``$n`` (one number per name, by first appearance) and
    ``%%`` as ``%``: what psycopg sends for it, so that a RawCursor runs the same statement with
    the same parameter types (``%s`` and a raw parameter are both dumped in the AUTO format).
    ``%(name)b`` and ``%(name)t`` ask for a format a RawCursor cannot give, and are refused.
    """
    names: list[str] = []

    def number(m: re.Match[str]) -> str:
        token = m.group(0)
        if token == "%%":
            return "%"
        if m.group(1) is None or m.group(2) != "s":
            raise ValueError(f"placeholder {token!r} has no positional form")
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"

    if re.search(r"\$\d", text):
        raise ValueError("the text has $n already")
    return Positional(_PLACEHOLDER.sub(number, text), tuple(names))


@cache
def positional(name: str, schema: str) -> Positional:
    """The statement ``name`` rendered for ``schema`` in positional form, converted once."""
    try:
        return to_positional(statement(name, schema))
    except ValueError as exc:
        raise RuntimeError(f"SQL statement {name!r}: {exc}") from None
