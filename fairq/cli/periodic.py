"""``fairq periodic list --app MODULE:APP``: an app's periodic schedules and their last ticks."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from fairq.cli._common import EXIT_OK, check_connection, format_table, print_json

if TYPE_CHECKING:
    from fairq.cli._common import Subparsers


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "periodic", parents=[common], help="list an app's periodic schedules",
        description="The periodic schedules the app at MODULE:APP declares (App.periodic), with "
        "the last tick enqueued for each and the next one, on the database clock (UTC); then "
        "the schedules the database knows that this app does not declare.")
    p.add_argument("action", nargs="?", choices=["list"], default="list",
                   help="list (the default)")
    p.add_argument("--app", required=True, metavar="MODULE:APP",
                   help="the fairq.App declaring the schedules, as for `fairq worker`")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from fairq.cli.worker import load_app_for
    from fairq.runtime.periodic import describe

    app = load_app_for(args, args.app)
    try:
        check_connection(app.dsn)
        shown = describe(app.store, app.periodics)
    finally:
        app.close()
    if args.json:
        print_json(shown)
        return EXIT_OK
    rows = [(s.name, s.tenant, s.task, s.cron, s.queue or "-",
             s.last_tick.isoformat() if s.last_tick else "-",
             s.last_job_id if s.last_job_id is not None else "-",
             s.next_tick.isoformat() if s.next_tick else "(not declared by this app)")
            for s in shown]
    print(format_table(["NAME", "TENANT", "TASK", "CRON", "QUEUE", "LAST TICK", "LAST JOB",
                        "NEXT TICK"], rows))
    return EXIT_OK
