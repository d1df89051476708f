"""Least-privilege roles (docs/roles.md): the GRANT statements for a worker, a producer, a
monitoring role and the operator console (read-only, or with its actions), rendered from
``fairq/sql/roles.sql`` for one schema and printed or applied by the schema's owner. Creating
the roles (and granting ``pg_monitor``) stays with a superuser."""

from __future__ import annotations

import re

from psycopg import sql as pgsql

from fairq import sql
from fairq.errors import InvalidInput
from fairq.names import validate_schema_name

KINDS = ("worker", "producer", "monitor", "console")
_ROLE_RE = re.compile(r"[a-z_][a-z0-9_]{0,62}")  # whole name: fullmatch


def validate_role_name(name: str) -> str:
    """A role name we are willing to put in a GRANT: the same rule as schema names."""
    if not isinstance(name, str) or not _ROLE_RE.fullmatch(name):
        raise InvalidInput(f"invalid role name {name!r}: use 1-63 characters of a-z, 0-9 and _, "
                           "not starting with a digit")
    return name


def grant_statements(schema: str, *, worker: str | None = None, producer: str | None = None,
                     monitor: str | None = None, worker_prune: bool = False,
                     console: str | None = None, console_actions: bool = False) -> list[str]:
    """The GRANT statements (one string per role) for the roles given."""
    schema = validate_schema_name(schema)
    blocks: list[tuple[str, str]] = []
    for kind, role in (("worker", worker), ("producer", producer), ("monitor", monitor),
                       ("console", console)):
        if role is not None:
            blocks.append((f"roles_grant_{kind}", validate_role_name(role)))
    if worker_prune:
        if worker is None:
            raise InvalidInput("--worker-prune needs --worker")
        blocks.append(("roles_grant_worker_prune", worker))
    if console_actions:
        if console is None:
            raise InvalidInput("--console-actions needs --console")
        blocks.append(("roles_grant_console_actions", console))
    if not blocks:
        raise InvalidInput("name at least one role: --worker, --producer, --monitor or --console")
    raw = sql._raw()
    return [
        pgsql.SQL(raw[name]).format(schema=pgsql.Identifier(schema),
                                    role=pgsql.Identifier(role)).as_string(None) + ";"
        for name, role in blocks
    ]


def apply(dsn: str, schema: str, statements: list[str]) -> None:
    """Run the grants in one transaction, as the connecting role (the schema's owner)."""
    import psycopg

    with psycopg.connect(dsn) as conn, conn.transaction():
        for statement in statements:
            conn.execute(statement)
