"""``fairq tenants set|apply|list|reset|delete``: weights and caps, effective from the next claim;
``fairq tenants explain``: why a tenant's next job has not started."""

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
from fairq.cli.safe_text import shown
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
    s.add_argument("--rate", type=_rate, metavar="JOBS_PER_S|unlimited",
                   help=f"jobs started per second in each queue, from {v.MIN_RATE:g} to "
                        f"{v.MAX_RATE:g}; 'unlimited' removes the limit")
    s.add_argument("--burst", type=integer("burst"),
                   help="jobs that may start at once after idling (default: one second's worth)")
    s.add_argument("--group", help="its tenant group (see `fairq groups`); 'default' for none")
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

    e = tsub.add_parser(
        "explain", parents=[common], help="why the tenant's next job has not started",
        description="Why the tenant's next job has not started, read from the database now: "
        "one line per queue where it has jobs (or the queue given). Reasons, in the order "
        "they are checked: no_jobs, no_worker, running, at_cap, rate_limited, no_due_jobs, "
        "group_at_share, waiting_turn (docs/explain.md).")
    e.add_argument("tenant")
    e.add_argument("--queue", help="only this queue (JSON: one object instead of a list)")
    e.add_argument("--json", action="store_true",
                   help="machine-readable output: the key `reason` and the details")
    e.set_defaults(handler=run_explain)


def _weight(text: str) -> float:
    """An argparse type: a weight in range, refused before anything connects."""
    try:
        return v.weight(v.parse_number("weight", text), shown=text.strip())
    except InvalidInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_UNLIMITED = "unlimited"


def _rate(text: str) -> float | str:
    """An argparse type: a rate in range or 'unlimited', refused before anything connects."""
    if text.strip().lower() == _UNLIMITED:
        return _UNLIMITED
    try:
        return v.rate(v.parse_number("rate (jobs per second, or 'unlimited')", text),
                      shown=text.strip())
    except InvalidInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _limit(t: TenantConfig) -> str:
    return "-" if t.rate is None else f"{t.rate:g}/s burst {t.burst}"


def _rows(tenants: list[TenantConfig]) -> str:
    return format_table(
        ["tenant", "group", "weight", "max_running", "rate", "running", "configured"],
        [[t.tenant, t.group or "default", f"{t.weight:g}", t.max_running, _limit(t), t.running,
          "yes" if t.configured else "default"]
         for t in tenants],
        right=[False, False, True, True, True, True, False],
    )


def run_set(args: argparse.Namespace) -> int:
    """Change the settings the flags name, and only those (last writer wins per field)."""
    if args.weight is None and args.max_running is None and args.rate is None \
            and args.burst is None and args.group is None:
        raise InvalidInput("give --weight, --max-running, --rate, --burst and/or --group")
    if args.rate == _UNLIMITED and args.burst is not None:
        raise InvalidInput("--burst needs a rate, not --rate unlimited")
    named = {"weight": args.weight, "max_running": args.max_running,
             "rate": None if args.rate == _UNLIMITED else args.rate, "burst": args.burst,
             "group": args.group}
    values = {k: x for k, x in named.items() if x is not None or (k == "rate" and args.rate)}
    patch = v.tenant_patch(args.tenant, values)  # every check before anything connects
    with open_app(args) as app:
        t = app.tenants.patch(patch)
    limit = "" if t.rate is None else f" rate={t.rate:g}/s burst={t.burst}"
    group = "" if t.group is None else f" group={t.group}"
    print(f"{shown(t.tenant)}: weight={t.weight:g} max_running={t.max_running}{limit}{group}")
    return EXIT_OK


def run_apply(args: argparse.Namespace) -> int:
    from fairq.admin.tenant_file import load_tenant_file

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
            print(f"{shown(args.tenant)}: " + ("settings dropped, the defaults apply" if had
                                       else "had no settings of its own; nothing to do"))
        else:
            known = app.tenants.delete(args.tenant)
            print(f"{shown(args.tenant)}: " + ("deleted" if known else "unknown; nothing to do"))
    return EXIT_OK


def run_explain(args: argparse.Namespace) -> int:
    v.name("tenant", args.tenant)  # a bad name: exit 2 before connecting to anything
    if args.queue is not None:
        v.name("queue", args.queue)
    with open_app(args) as app:
        found = (app.tenants.explain(args.tenant, args.queue) if args.queue is not None
                 else app.tenants.explain(args.tenant))
    if args.json:
        print_json(found)
        return EXIT_OK
    for e in found if isinstance(found, list) else [found]:
        print(f"{shown(e.tenant)} {shown(e.describe())}")
    return EXIT_OK
