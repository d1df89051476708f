"""``fairq roles``: print or apply the least-privilege GRANTs for worker, producer and monitor."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from fairq.cli._common import EXIT_OK

if TYPE_CHECKING:
    from fairq.cli._common import Subparsers


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "roles", parents=[common], help="least-privilege GRANTs for worker/producer/monitor/console roles",
        description="Print (--print) or apply as the schema's owner (--apply) the GRANT "
        "statements of docs/roles.md. The roles must exist (CREATE ROLE is a superuser's job).")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--print", action="store_true", dest="print_sql", help="print the SQL")
    mode.add_argument("--apply", action="store_true", help="run it against the database")
    p.add_argument("--worker", metavar="ROLE", help="role of the workers (claim/finish only)")
    p.add_argument("--producer", metavar="ROLE", help="role of the producers (enqueue only)")
    p.add_argument("--monitor", metavar="ROLE", help="read-only role for stats and the exporter")
    p.add_argument("--console", metavar="ROLE",
                   help="role of the operator console, fairq web (read-only)")
    p.add_argument("--console-actions", action="store_true",
                   help="also let the console role retry, cancel and set tenants "
                        "(fairq web --allow-actions)")
    p.add_argument("--worker-prune", action="store_true",
                   help="also let the worker role delete finished jobs (its pruner)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from fairq.admin import roles
    from fairq.cli._common import check_connection, resolve
    from fairq.config import resolve_schema

    schema = resolve_schema(getattr(args, "schema", None))
    statements = roles.grant_statements(schema, worker=args.worker, producer=args.producer,
                                        monitor=args.monitor, worker_prune=args.worker_prune,
                                        console=args.console,
                                        console_actions=args.console_actions)
    if args.print_sql:
        print("\n\n".join(statements))
        return EXIT_OK
    dsn, schema = resolve(args)
    check_connection(dsn)
    roles.apply(dsn, schema, statements)
    print(f"granted: {len(statements)} role block(s) on schema {schema}")
    return EXIT_OK
