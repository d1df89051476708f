"""``fairq stats``: per-tenant backlog, running vs cap, outcomes, and recent share vs weight."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from fairq.cli._common import EXIT_OK, format_table, integer, number, open_app, print_json

if TYPE_CHECKING:
    from fairq.cli._common import Subparsers

# 100 years: the window's start is now() minus the window, and a timestamp far enough back
# overflows in PostgreSQL.
MAX_WINDOW_S = 100 * 365 * 86400


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    from fairq.metrics.stats import DEFAULT_TIMEOUT_MS, DEFAULT_WINDOW_S

    p = sub.add_parser(
        "stats", parents=[common],
        help="per-tenant queued/running/done/failed, oldest wait, share vs weight",
        description="Per (queue, tenant): queued jobs (due/delayed), running/cap, weight, done, "
        "failed, share of the jobs started in the last --window seconds beside the share of "
        "weight among active tenants, the age of the oldest due job, and why its next job has "
        "not started (the reason of `fairq tenants explain`).",
    )
    p.add_argument("--window", type=number("window", minimum=1, maximum=MAX_WINDOW_S),
                   default=DEFAULT_WINDOW_S, metavar="SECONDS",
                   help=f"recent-claims window (default {DEFAULT_WINDOW_S:g}, at most "
                   f"{MAX_WINDOW_S:g}: 100 years)")
    p.add_argument("--queue", help="only this queue")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--timeout-ms", type=integer("timeout-ms", minimum=1),
                   default=DEFAULT_TIMEOUT_MS,
                   help=f"statement timeout (default {DEFAULT_TIMEOUT_MS})")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from fairq.metrics.stats import HEADERS, RIGHT, table_rows, tenant_stats

    with open_app(args) as app:
        stats = tenant_stats(app, window_s=args.window, queue=args.queue,
                             timeout_ms=args.timeout_ms)
    if args.json:
        print_json({"window_seconds": args.window, "tenants": stats})
    elif stats:
        print(format_table(HEADERS, table_rows(stats), right=RIGHT))
        print(f"\nclaims: share of jobs started in the last {args.window:g}s; weight share: among "
              "tenants with due, running or recent jobs; reason: why the next job has not "
              "started (`fairq tenants explain TENANT` for the details)")
    else:
        print("no jobs yet")
    return EXIT_OK
