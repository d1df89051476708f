"""``fairq migrate [--sql]``: create or upgrade fairq's tables, or print the SQL that would."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from fairq.cli._common import EXIT_OK, check_connection, resolve

if TYPE_CHECKING:
    from fairq.cli._common import Subparsers


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "migrate", parents=[common], help="apply migrations (or print their SQL)",
        description="Create or upgrade fairq's tables. Idempotent; safe from many processes "
        "at once.",
    )
    p.add_argument("--sql", action="store_true",
                   help="print the SQL for an empty database instead of connecting")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from fairq import migrate
    from fairq.config import redact, resolve_schema

    if args.sql:
        sys.stdout.write(migrate.upgrade_sql(resolve_schema(getattr(args, "schema", None))))
        return EXIT_OK
    dsn, schema = resolve(args)
    check_connection(dsn)
    migrate.upgrade(dsn, schema)
    print(f"schema {schema} is up to date ({redact(dsn)})")
    return EXIT_OK
