"""``fairq bench``: the benchmark suite (in ``benchmarks/`` of a checkout, not in the wheel)."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fairq.cli._common import EXIT_ERROR, check_connection

if TYPE_CHECKING:
    from fairq.cli._common import Subparsers

HINT = ("fairq bench: the benchmarks are not installed with the package; run it from a checkout "
        "of the fairq repository (./scripts/fairq bench, or python -m fairq bench in its root) "
        "with pip install 'fairq[bench]'")


def _suite() -> Any | None:
    """``benchmarks.suite``, looked for on sys.path, then in the checkout next to this package
    (an editable install) and in the current directory."""
    for root in (None, Path(__file__).resolve().parents[2], Path.cwd()):
        if root is not None:
            if not (root / "benchmarks" / "suite.py").is_file():
                continue
            if str(root) not in sys.path:
                sys.path.insert(0, str(root))
        try:
            return importlib.import_module("benchmarks.suite")
        except ModuleNotFoundError as exc:
            if exc.name not in ("benchmarks", "benchmarks.suite"):
                raise
    return None


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "bench", parents=[common], help="benchmark fifo, the lab's round robin "
        "(benchmarks/lab/rr.sql), fairq's policies and peer queues side by side",
        description="Runs every scenario (noisy neighbour and 100x, Zipf over 1,000 tenants, "
        "100,000 tenants, a hot tenant, caps, weighted tiers with steady arrivals, delayed jobs "
        "and retries) under fifo, rr_article, round_robin, weighted and drr, then PgQueuer and "
        "Procrastinate, in a scratch database dropped afterwards. Needs a checkout.",
    )
    suite = _suite()
    if suite is not None:
        suite.add_arguments(p)
    else:
        p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    suite = _suite()
    if suite is None:
        print(HINT, file=sys.stderr)
        return EXIT_ERROR
    from fairq.config import resolve_dsn

    dsn = resolve_dsn(getattr(args, "dsn", None))
    check_connection(dsn)
    code: int = suite.run(args, dsn)
    return code
