"""``fairq tenants set|apply|list``: weights and caps, effective from the next claim."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from fairq import validation as v
from fairq.cli._common import (
    EXIT_OK,
    format_table,
    integer,
    open_app,
    print_json,
)
from fairq.errors import InvalidInput

if TYPE_CHECKING:
    from fairq.cli._common import Subparsers
    from fairq.models import TenantConfig


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("tenants", parents=[common], help="tenant weights and caps",
                       description="Tenant weights and caps; changes apply to the next claim.")
    tsub = p.add_subparsers(dest="tenants_command", metavar="ACTION")
    tsub.required = True

    s = tsub.add_parser("set", parents=[common], help="set one tenant's weight and/or cap")
    s.add_argument("tenant")
    s.add_argument("--weight", type=_weight,
                   help=f"share of claims, from {v.MIN_WEIGHT:g} to {v.MAX_WEIGHT:g} (inclusive)")
    s.add_argument("--max-running", type=integer("max-running"),
                   help="running jobs at most (0 pauses the tenant)")
    s.set_defaults(handler=run_set)

    a = tsub.add_parser("apply", parents=[common],
                        help="apply a tenants TOML file (all or nothing)")
    a.add_argument("file", metavar="FILE.toml")
    a.set_defaults(handler=run_apply)

    for action, text in (("reset", "drop a tenant's own weight and cap: the defaults apply"),
                         ("delete", "forget a tenant (refused while it has queued or running "
                                    "jobs)")):
        d = tsub.add_parser(action, parents=[common], help=text)
        d.add_argument("tenant")
        d.set_defaults(handler=run_forget)

    ls = tsub.add_parser("list", parents=[common], help="every tenant and its effective settings")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(handler=run_list)


def _weight(text: str) -> float:
    """An argparse type: a weight in range, refused before anything connects."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"weight must be a number, not {text!r}") from None
    try:
        return v.weight(value, shown=text.strip())
    except InvalidInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _rows(tenants: list[TenantConfig]) -> str:
    return format_table(
        ["tenant", "weight", "max_running", "running", "configured"],
        [[t.tenant, f"{t.weight:g}", t.max_running, t.running, "yes" if t.configured else "default"]
         for t in tenants],
        right=[False, True, True, True, False],
    )


def run_set(args: argparse.Namespace) -> int:
    if args.weight is None and args.max_running is None:
        raise InvalidInput("give --weight and/or --max-running")
    with open_app(args) as app:
        t = app.tenants.set(args.tenant, weight=args.weight, max_running=args.max_running)
    print(f"{t.tenant}: weight={t.weight:g} max_running={t.max_running}")
    return EXIT_OK


def run_apply(args: argparse.Namespace) -> int:
    from fairq.tenant_config import load_tenant_file

    load_tenant_file(args.file)  # bad file: exit 2 before connecting to anything
    with open_app(args) as app:
        applied = app.tenants.apply(args.file)
    print(f"applied {len(applied)} tenant(s) from {args.file}")
    return EXIT_OK


def run_list(args: argparse.Namespace) -> int:
    with open_app(args) as app:
        tenants = app.tenants.list()
    if args.json:
        print_json(tenants)
    elif tenants:
        print(_rows(tenants))
    else:
        print("no tenants yet")
    return EXIT_OK


def run_forget(args: argparse.Namespace) -> int:
    """``tenants reset T`` and ``tenants delete T``."""
    with open_app(args) as app:
        if args.tenants_command == "reset":
            had = app.tenants.reset(args.tenant)
            print(f"{args.tenant}: " + ("settings dropped, the defaults apply" if had
                                       else "had no settings of its own; nothing to do"))
        else:
            known = app.tenants.delete(args.tenant)
            print(f"{args.tenant}: " + ("deleted" if known else "unknown; nothing to do"))
    return EXIT_OK
