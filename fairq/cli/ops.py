"""``fairq jobs`` and ``fairq retry``: find jobs and queue failed ones again, from the shell.
(``fairq cancel --tenant`` and ``fairq tenants delete|reset`` live with their command groups.)"""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import TYPE_CHECKING

from fairq.cli._common import EXIT_OK, EXIT_USAGE, format_table, integer, open_app, print_json
from fairq.errors import InvalidInput

if TYPE_CHECKING:
    from fairq.cli._common import Subparsers
    from fairq.models import JobInfo


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    from fairq.admin.ops import DEFAULT_RETRY_LIMIT, STATUSES

    j = sub.add_parser("jobs", parents=[common], help="list jobs (newest first)",
                       description="List jobs, newest first, filtered by status, tenant, task "
                       "and queue.")
    j.add_argument("--status", choices=STATUSES)
    j.add_argument("--tenant")
    j.add_argument("--task")
    j.add_argument("--queue")
    j.add_argument("--limit", type=integer("limit", minimum=1), default=50,
                   help="at most N jobs (default 50)")
    j.add_argument("--json", action="store_true", help="machine-readable output (every field)")
    j.set_defaults(handler=run_jobs)

    r = sub.add_parser("retry", parents=[common], help="queue failed jobs again",
                       description="Queue failed (or cancelled) jobs again, due now, with their "
                       "attempts reset: the ids given, or --failed ones (of --tenant). Their "
                       "tenants become runnable at once; running workers pick them up.")
    r.add_argument("ids", nargs="*", type=integer("job id", minimum=1), metavar="ID")
    r.add_argument("--failed", action="store_true", help="every failed job, up to --limit")
    r.add_argument("--tenant", help="with --failed: only this tenant's")
    r.add_argument("--limit", type=integer("limit", minimum=1), default=DEFAULT_RETRY_LIMIT,
                   help=f"with --failed: at most N jobs a run (default {DEFAULT_RETRY_LIMIT})")
    r.set_defaults(handler=run_retry)


def _first_line(text: str | None, width: int = 60) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= width else line[: width - 3] + "..."


def _when(at: datetime) -> str:
    from fairq.store.loaders import OutOfRangeTime

    return str(at) if isinstance(at, OutOfRangeTime) else at.isoformat(timespec="seconds")


def _table(jobs: list[JobInfo]) -> str:
    return format_table(
        ["id", "status", "tenant", "task", "queue", "attempts", "run_at", "last_error"],
        [[j.id, j.status, j.tenant, j.task, j.queue, f"{j.attempts}/{j.max_attempts}",
          _when(j.run_at), _first_line(j.last_error)] for j in jobs],
        right=[True, False, False, False, False, True, False, False],
    )


def run_jobs(args: argparse.Namespace) -> int:
    with open_app(args) as app:
        found = app.jobs(status=args.status, tenant=args.tenant, task=args.task,
                         queue=args.queue, limit=args.limit)
    if args.json:
        print_json(found)
    elif found:
        print(_table(found))
    else:
        print("no jobs match")
    return EXIT_OK


def run_retry(args: argparse.Namespace) -> int:
    import sys

    if bool(args.ids) == bool(args.failed):
        raise InvalidInput("give job ids or --failed, not both")
    if args.ids and args.tenant is not None:
        raise InvalidInput("--tenant goes with --failed")
    with open_app(args) as app:
        retried = app.retry(*args.ids, failed=args.failed, tenant=args.tenant, limit=args.limit)
    print(f"retried {len(retried)} job(s)" + (f": {' '.join(map(str, retried))}"
                                               if retried and len(retried) <= 20 else ""))
    if args.failed and retried.picked == args.limit:
        print(f"--limit {args.limit} reached: more failed jobs may remain; run again")
    for job_id, why in retried.not_retried.items():  # one line each, on stderr
        print(f"fairq retry: job {job_id} not retried: {why}", file=sys.stderr)
    return EXIT_USAGE if retried.not_retried else EXIT_OK
