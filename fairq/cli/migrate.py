"""``fairq migrate [--status | --sql [--from REV]]``: create or upgrade fairq's tables, say
where a schema stands, or print the SQL an upgrade would run."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from fairq.cli._common import EXIT_OK, check_connection, print_json, resolve
from fairq.config import ENV_URL

if TYPE_CHECKING:
    from fairq.cli._common import Subparsers
    from fairq.migrate import Status


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "migrate", parents=[common], help="apply migrations (or print their SQL, or --status)",
        description="Create or upgrade fairq's tables and say what was done. Idempotent; safe "
        "from many processes at once. In a rolling upgrade, migrate first, then restart the "
        "workers: older workers keep running on the newer schema.",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--sql", action="store_true",
                      help="print the SQL of the upgrade from the database's current revision "
                      "instead of running it (from an empty database when no URL is set)")
    mode.add_argument("--status", action="store_true",
                      help="the schema's revision, this fairq's head, and what an upgrade would do")
    p.add_argument("--from", dest="start", metavar="REV",
                   help="with --sql: the revision to start from (base: an empty database), "
                   "without connecting")
    p.add_argument("--json", action="store_true", help="with --status: machine-readable output")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from fairq import migrate
    from fairq.config import redact, resolve_schema
    from fairq.errors import InvalidInput

    if args.start is not None and not args.sql:
        raise InvalidInput("--from goes with --sql")
    if args.sql:
        schema = resolve_schema(getattr(args, "schema", None))
        start = args.start
        if start is None and (getattr(args, "dsn", None) or os.environ.get(ENV_URL)):
            dsn, schema = resolve(args)
            check_connection(dsn)
            start = migrate.current(dsn, schema) or "base"
        text = migrate.upgrade_sql(schema, start=start)
        if not text:
            print(f"-- schema {schema} is at fairq revision {start}: nothing to upgrade")
        sys.stdout.write(text)
        return EXIT_OK
    dsn, schema = resolve(args)
    check_connection(dsn)
    if args.status:
        st = migrate.status(dsn, schema)
        if args.json:
            print_json(st)
        else:
            print(_describe(st))
        return EXIT_OK
    before, after = migrate.upgrade(dsn, schema)
    where = f"schema {schema} ({redact(dsn)})"
    if before == after:
        print(f"{where} is already at fairq revision {after}: nothing to do")
    elif before is None:
        print(f"{where}: created fairq's tables at revision {after}")
    else:
        print(f"{where}: upgraded from revision {before} to {after}")
    return EXIT_OK


def _describe(st: Status) -> str:
    lines = [f"schema {st.schema}: revision {st.current or 'none (no fairq tables)'}, "
             f"this fairq's head {st.head}"]
    if not st.known:
        lines.append(f"revision {st.current} is newer than this fairq: nothing to do "
                     "(older workers keep running on it)")
    elif not st.pending:
        lines.append("up to date: nothing to do")
    else:
        lines.append(f"`fairq migrate` would apply {len(st.pending)} migration(s):")
        lines += [f"  {rev}  {doc}" for rev, doc in st.pending]
        lines.append("review the SQL with `fairq migrate --sql`")
    return "\n".join(lines)
