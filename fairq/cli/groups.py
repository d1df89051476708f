"""``fairq groups set|list``: tenant groups' weights, effective from the next claim."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from fairq.cli._common import EXIT_OK, format_table, open_app, print_json
from fairq.cli.safe_text import shown
from fairq.cli.tenants import _weight

if TYPE_CHECKING:
    from fairq.cli._common import Subparsers


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("groups", parents=[common], help="tenant groups and their weights",
                       description="A group's share follows its weight among the groups with "
                                   "runnable work; its tenants share it by their own weights.")
    gsub = p.add_subparsers(dest="groups_command", metavar="ACTION")
    gsub.required = True
    s = gsub.add_parser("set", parents=[common], help="create a group or change its weight")
    s.add_argument("group")
    s.add_argument("--weight", type=_weight, required=True, help="the group's share of claims")
    s.set_defaults(handler=run_set)
    ls = gsub.add_parser("list", parents=[common], help="every group and its weight")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(handler=run_list)


def run_set(args: argparse.Namespace) -> int:
    with open_app(args) as app:
        g = app.groups.set(args.group, weight=args.weight)
    print(f"group {shown(g.name)}: weight={g.weight:g}")
    return EXIT_OK


def run_list(args: argparse.Namespace) -> int:
    with open_app(args) as app:
        groups = app.groups.list()
    if args.json:
        print_json(groups)
    else:
        print(format_table(["group", "weight", "tenants", "configured"],
                           [[g.name, f"{g.weight:g}", g.tenants, "yes" if g.configured else "no"]
                            for g in groups], right=[False, True, True, False]))
    return EXIT_OK
