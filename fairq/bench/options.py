"""``fairq bench``'s options and the optional packages a run needs (light: no database driver).

The scenarios, fairq's policies and the lab's round robin need only fairq itself; the progress
bar (tqdm), the plots (matplotlib) and the peer queues (PgQueuer on asyncpg, Procrastinate) come
with the ``bench`` extra, and a run checks for the ones its options use before it starts.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

from fairq.bench import scenarios

RR_POLICY = "rr_article"
POLICIES = ("fifo", RR_POLICY, "round_robin", "weighted", "drr")
PEER_PACKAGES = ("pgqueuer", "asyncpg", "procrastinate")
INSTALL_HINT = "pip install 'fairq[bench]'"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="small sizes: under two minutes")
    p.add_argument("--tiny", action="store_true",
                   help="one 75-job scenario, no peers: a few seconds per policy (a smoke run)")
    p.add_argument("--scenario", action="append", metavar="NAME",
                   help="only these scenarios (repeatable): " + ", ".join(scenarios.FULL))
    p.add_argument("--policy", action="append", metavar="NAME",
                   help="only these policies (repeatable): " + ", ".join(POLICIES))
    p.add_argument("--no-peers", action="store_true", help="skip PgQueuer and Procrastinate")
    p.add_argument("--deadline", type=float, default=None, metavar="SECONDS",
                   help="stop a run after this long (default 6 quick, 90 full)")
    p.add_argument("--json", metavar="PATH", help="write every figure as JSON")
    p.add_argument("--plots", metavar="DIR", help="write PNG plots (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def runs_peers(args: argparse.Namespace) -> bool:
    return not (args.no_peers or args.tiny)


def needed_packages(args: argparse.Namespace) -> list[str]:
    """The optional packages this run imports: only what its options use."""
    needed: list[str] = []  # no tqdm: the run goes on without a progress bar
    if args.plots:
        needed.append("matplotlib")
    if runs_peers(args):
        needed.extend(PEER_PACKAGES)
    return needed


def missing_packages(args: argparse.Namespace) -> list[str]:
    return [name for name in needed_packages(args) if importlib.util.find_spec(name) is None]


def report_missing(args: argparse.Namespace) -> bool:
    """Print one line naming the missing packages and the extra that brings them; True if any."""
    missing = missing_packages(args)
    if missing:
        print(f"fairq bench: {', '.join(missing)} not installed: {INSTALL_HINT}", file=sys.stderr)
    return bool(missing)
