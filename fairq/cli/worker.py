"""``fairq worker MODULE:APP``: run an application's tasks until stopped or drained."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

from fairq.cli._common import (
    EXIT_OK,
    MAX_PORT,
    add_log_level,
    check_connection,
    integer,
    number,
    setup_logging,
)
from fairq.config import ENV_SCHEMA, ENV_URL
from fairq.errors import InvalidInput

if TYPE_CHECKING:
    from fairq.app import App
    from fairq.cli._common import Subparsers


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    from fairq.policies import DEFAULT_POLICY, POLICIES
    from fairq.runtime import MAX_CONCURRENCY, MAX_SECONDS

    p = sub.add_parser(
        "worker", parents=[common], help="run an app's tasks",
        description="Run the tasks of the fairq.App found at MODULE:APP (e.g. myproj.tasks:app). "
        "SIGTERM/SIGINT stop it after in-flight jobs finish.",
    )
    p.add_argument("target", metavar="MODULE:APP",
                   help="module and App attribute; ':APP' may be left out if the module has one")
    p.add_argument("--concurrency", type=integer("concurrency", minimum=1,
                                                 maximum=MAX_CONCURRENCY), default=8,
                   help="jobs run at once (default 8)")
    p.add_argument("--queue", action="append", dest="queues", metavar="Q",
                   help="queue to serve (repeatable; default: the app's tasks' queues)")
    p.add_argument("--policy", default=DEFAULT_POLICY,
                   help=f"scheduling policy: {', '.join(sorted(POLICIES))} "
                   f"(default {DEFAULT_POLICY})")
    p.add_argument("--metrics-port", type=integer("metrics-port", minimum=0, maximum=MAX_PORT),
                   help="serve /metrics, /livez (the loop turns, database or not) and /readyz "
                   "(it can claim) on this port (fairq's port is 9766; off by default)")
    p.add_argument("--metrics-host", default="127.0.0.1",
                   help="bind address for --metrics-port (default 127.0.0.1; 0.0.0.0 to be "
                   "scraped from another host or container)")
    p.add_argument("--until-empty", action="store_true",
                   help="drain: exit once nothing is runnable and nothing of ours runs (a "
                   "rate-limited tenant's due jobs are waited for, token by token; delayed jobs, "
                   "capped and paused tenants are left)")
    p.add_argument("--poll-interval", type=number("poll-interval", minimum=0.01,
                                                  maximum=MAX_SECONDS), metavar="S",
                   help="fallback poll when no NOTIFY arrives (seconds)")
    p.add_argument("--batch", type=integer("batch", minimum=1), metavar="N",
                   help="claim at most N jobs a round trip (default twice the slots, 10 to 256; "
                   "never more than the free slots and those claimed ahead)")
    p.add_argument("--claim-ahead", type=integer("claim-ahead", minimum=0, maximum=1024),
                   metavar="N", help="while jobs are short (under 50 ms), hold up to N jobs "
                   "claimed beyond the slots (default: as many as the slots, at most one batch; "
                   "0: never)")
    p.add_argument("--grace-period", type=number("grace-period", minimum=0), metavar="S",
                   help="on SIGTERM, let running jobs finish for S seconds before handing them "
                   "back (default 30; keep the supervisor's kill timeout above it)")
    p.add_argument("--reap-grace", type=number("reap-grace", minimum=0, maximum=MAX_SECONDS),
                   metavar="S", help="after a lost database connection, return expired leases "
                   "only once this process has been connected again for S seconds, so live "
                   "workers renew theirs first (default 5; docs/reliability.md)")
    p.add_argument("--durable-finishes", action="store_true",
                   help="commit each finish with the WAL flushed (default: a database crash may "
                        "undo the last finishes, which then run again; never a lost job)")
    p.add_argument("--time-half-life", type=number("time-half-life", minimum=0.001,
                                                   maximum=MAX_SECONDS), metavar="S",
                   help="forget old usage: each backlogged tenant's lead in virtual time over "
                   "its queue's halves every S seconds (default: never)")
    add_log_level(p)
    p.set_defaults(handler=run)


def load_app(target: str) -> App:
    """Import ``module[:attr.path]`` and return the ``fairq.App`` it names (or the only one)."""
    from fairq.app import App

    module_name, _, attr = target.partition(":")
    if not module_name:
        raise InvalidInput(f"expected MODULE:APP, not {target!r}")
    if os.getcwd() not in sys.path:  # like `python -m`: the current folder is importable
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise InvalidInput(f"cannot import module {module_name!r}: {exc}") from None
        raise
    if attr:
        obj: Any = module
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise InvalidInput(f"module {module_name!r} has no attribute {attr!r}")
            obj = getattr(obj, part)
        if not isinstance(obj, App):
            raise InvalidInput(f"{target} is a {type(obj).__name__}, not a fairq.App")
        return obj
    apps = {id(v): v for v in vars(module).values() if isinstance(v, App)}
    if len(apps) != 1:
        found = "no fairq.App" if not apps else f"{len(apps)} fairq.App objects"
        raise InvalidInput(f"module {module_name!r} has {found}: name one as {module_name}:APP")
    return next(iter(apps.values()))


def load_app_for(args: argparse.Namespace, target: str) -> App:
    """``load_app`` with ``--dsn``/``--schema`` in the environment first: the app module usually
    builds ``fairq.App()`` at import time, reading them."""
    if getattr(args, "dsn", None):
        os.environ[ENV_URL] = args.dsn
    if getattr(args, "schema", None):
        os.environ[ENV_SCHEMA] = args.schema
    return load_app(target)


def run(args: argparse.Namespace) -> int:
    from fairq.policies import get_policy

    policy = get_policy(args.policy)  # unknown policy: exit 2 before importing user code
    app = load_app_for(args, args.target)
    setup_logging(args.log_level)  # after the import: an app that configures logging wins
    check_connection(app.dsn)
    options: dict[str, Any] = {
        "concurrency": args.concurrency,
        "queues": args.queues or None,
        "policy": policy,  # resolved once, here
        "durable_finishes": args.durable_finishes,
    }
    if args.batch is not None:
        options["batch"] = args.batch
    if args.claim_ahead is not None:
        options["claim_ahead"] = args.claim_ahead
    if args.grace_period is not None:
        options["grace_period"] = args.grace_period
    if args.poll_interval is not None:
        options["poll_interval"] = args.poll_interval
    if args.time_half_life is not None:
        options["time_half_life"] = args.time_half_life
    if args.reap_grace is not None:
        options["reap_grace"] = args.reap_grace
    if args.metrics_port is not None:
        from fairq.metrics import start_worker_metrics  # prometheus_client only when asked

        options["observer"] = start_worker_metrics(app, host=args.metrics_host,
                                                   port=args.metrics_port)
    try:
        app.worker(**options).run(until_empty=args.until_empty)
    finally:
        app.close()
    return EXIT_OK
