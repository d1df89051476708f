"""``fairq demo``: watch FIFO starve small tenants behind a noisy one, and ``weighted`` not."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from fairq.cli._common import EXIT_OK, check_connection

if TYPE_CHECKING:
    from fairq.cli._common import Subparsers


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "demo", parents=[common], help="the noisy neighbour under fifo, then weighted",
        description="Enqueue 1,000 jobs for one tenant, then 5 for each of ten others, and drain "
        "them with 8 worker slots under fifo and then weighted, showing per-tenant progress. "
        "Works in a scratch schema with a random name, dropped afterwards (--schema is ignored). "
        "With no --dsn or $FAIRQ_DATABASE_URL it uses the embedded PostgreSQL.",
    )
    p.add_argument("--quick", action="store_true", help="a smaller backlog (a few seconds)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from fairq import demo
    from fairq.config import resolve_dsn

    dsn = resolve_dsn(getattr(args, "dsn", None))
    check_connection(dsn)
    demo.run(dsn, demo.QUICK if args.quick else demo.Shape())
    return EXIT_OK
