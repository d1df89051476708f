"""``fairq bench``: the benchmark suite of ``fairq.bench`` (its optional packages: the ``bench`` extra)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from fairq.bench import options
from fairq.cli._common import EXIT_USAGE, check_connection

if TYPE_CHECKING:
    from fairq.cli._common import Subparsers


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "bench", parents=[common], help="benchmark fifo, the lab's round robin, fairq's "
        "policies and peer queues side by side",
        description="Runs every scenario (noisy neighbour and 100x, Zipf over 1,000 tenants, "
        "100,000 tenants, a hot tenant, caps, weighted tiers with steady arrivals, delayed jobs "
        "and retries) under fifo, rr_article, round_robin, weighted and drr, then PgQueuer and "
        "Procrastinate, in a scratch database dropped afterwards. The progress bar, the plots "
        f"and the peers need {options.INSTALL_HINT}.",
    )
    options.add_arguments(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if options.report_missing(args):  # before connecting: nothing to clean up yet
        return EXIT_USAGE
    from fairq.bench import suite
    from fairq.config import resolve_dsn

    dsn = resolve_dsn(getattr(args, "dsn", None))
    check_connection(dsn)
    return suite.run(args, dsn)
