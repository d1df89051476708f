"""``fairq enqueue``, ``fairq job``, ``fairq cancel``, ``fairq prune``: jobs from the shell."""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import TYPE_CHECKING

from fairq import validation as v
from fairq.cli._common import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    check_connection,
    integer,
    json_argument,
    number,
    open_app,
    print_json,
)
from fairq.cli.safe_text import shown
from fairq.errors import InvalidInput

if TYPE_CHECKING:
    from fairq.app import App
    from fairq.cli._common import Subparsers

DEFAULT_PRUNE_AGE = 7 * 86400
MAX_PRUNE_AGE = 100 * 365 * 86400  # a PostgreSQL interval overflows long before 1e308 s


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    e = sub.add_parser("enqueue", parents=[common], help="enqueue one job; prints its id",
                       description="Enqueue one job by task name; prints the job id.")
    e.add_argument("task", metavar="TASK", help="task name, e.g. reports.send_report")
    e.add_argument("--tenant", required=True)
    e.add_argument("--payload", type=json_argument("payload"), default=None, metavar="JSON",
                   help="JSON payload (default {})")
    when = e.add_mutually_exclusive_group()
    when.add_argument("--delay", type=number("delay", minimum=0), metavar="SECONDS",
                      help="run no earlier than this many seconds from now (database clock)")
    when.add_argument("--run-at", type=run_at_argument, metavar="TIME",
                      help="run no earlier than this time: ISO 8601 with a UTC offset, e.g. "
                      "2030-01-01T09:00:00+00:00, between 1970-01-01 and 9999-01-01 UTC")
    e.add_argument("--priority", type=integer("priority"), help="higher runs first within a tenant")
    e.add_argument("--queue", help="queue name (default: default)")
    e.add_argument("--cost", type=number("cost"), help="work units, for the drr policy (default 1)")
    e.add_argument("--max-attempts", type=integer("max-attempts", minimum=1), metavar="N",
                   help="attempts before the job fails for good (default: the task's)")
    e.add_argument("--lease", type=integer("lease", minimum=1), metavar="SECONDS",
                   help="lease of each attempt (default: the task's)")
    source = e.add_mutually_exclusive_group()
    source.add_argument("--app", metavar="MODULE:APP",
                        help="the fairq.App registering TASK (default: TASK's module, found as "
                        "`fairq worker` finds an app); the job gets the task's queue, priority, "
                        "cost, lease and attempts unless given here")
    source.add_argument("--no-app", action="store_true",
                        help="enqueue TASK by name without loading its app: nothing checks the "
                        "name, and what is not given here takes fairq's defaults (queue default)")
    e.add_argument("--key", help="idempotency key: while a job of this task with this key is "
                                 "queued or running, print its id and enqueue nothing")
    e.set_defaults(handler=run_enqueue)

    j = sub.add_parser("job", parents=[common], help="show a job as JSON")
    j.add_argument("id", type=integer("job id", minimum=1), metavar="ID")
    j.set_defaults(handler=run_job)

    c = sub.add_parser("cancel", parents=[common],
                       help="cancel a queued job, or a tenant's queued jobs (--tenant)")
    c.add_argument("id", type=integer("job id", minimum=1), metavar="ID", nargs="?")
    c.add_argument("--tenant", help="cancel this tenant's queued jobs (one statement); running "
                   "jobs finish")
    c.add_argument("--queue", help="with --tenant: only this queue's")
    c.add_argument("--limit", type=integer("limit", minimum=1), default=100_000,
                   help="with --tenant: at most N jobs (default 100000)")
    c.set_defaults(handler=run_cancel)

    p = sub.add_parser("prune", parents=[common], help="delete finished jobs older than an age")
    p.add_argument("--older-than", type=number("older-than", minimum=0, maximum=MAX_PRUNE_AGE),
                   default=DEFAULT_PRUNE_AGE,
                   metavar="SECONDS",
                   help=f"age of finished jobs to delete (default {DEFAULT_PRUNE_AGE})")
    p.set_defaults(handler=run_prune)


def run_enqueue(args: argparse.Namespace) -> int:
    # Checked before the app is imported, so a bad value reads the same with or without it.
    v.name("task", args.task)
    v.name("tenant", args.tenant)
    v.payload({} if args.payload is None else args.payload)
    v.run_at(args.run_at, None)
    options = {"tenant": args.tenant, "payload": args.payload, "delay": args.delay,
               "run_at": args.run_at,
               "priority": args.priority, "queue": args.queue, "cost": args.cost,
               "max_attempts": args.max_attempts, "lease": args.lease,
               "key": args.key}
    if args.no_app:
        with open_app(args) as app:
            job_id = app.enqueue(args.task, **options)
    else:
        app = task_app(args)
        try:
            check_connection(app.dsn)
            job_id = app.enqueue(args.task, **options)
        finally:
            app.close()
    print(job_id)
    return EXIT_OK


def run_at_argument(text: str) -> datetime:
    """``--run-at``: an ISO 8601 time with its UTC offset (its range is checked with the other
    options, by ``validation.run_at``)."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"run-at must be an ISO 8601 time such as 2030-01-01T09:00:00+00:00, not {text!r}"
        ) from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"run-at needs a UTC offset (such as +00:00 or Z), not {text!r}")
    return value


def task_app(args: argparse.Namespace) -> App:
    """The app registering ``args.task``: ``--app``, else the module the task's name starts with
    (``myapp.tasks`` for ``myapp.tasks.send_report``); refuses a task that app does not know."""
    from fairq.cli.worker import load_app_for

    target = args.app
    if target is None:
        module = args.task.rpartition(".")[0]
        if not module:
            raise InvalidInput(f"cannot tell which module registers task {args.task!r}: pass "
                               "--app MODULE:APP (or --no-app to enqueue it unchecked)")
        try:
            app = load_app_for(args, module)
        except InvalidInput as exc:
            raise InvalidInput(f"cannot load the app of task {args.task!r} ({exc}): pass "
                               "--app MODULE:APP (or --no-app to enqueue it unchecked)") from None
        target = module
    else:
        app = load_app_for(args, target)
    if args.task not in app.tasks:
        known = ", ".join(sorted(app.tasks)) or "no task"
        app.close()
        raise InvalidInput(f"unknown task {args.task!r}: {target} registers {known}")
    return app


def run_job(args: argparse.Namespace) -> int:
    import sys

    with open_app(args) as app:
        info = app.job(args.id)
    if info is None:  # an id the user gave that names nothing: bad input
        print(f"fairq job: no job {args.id}", file=sys.stderr)
        return EXIT_USAGE
    print_json(info)
    return EXIT_OK


def run_cancel(args: argparse.Namespace) -> int:
    import sys

    if (args.id is None) == (args.tenant is None):
        raise InvalidInput("give a job ID or --tenant T, not both")
    if args.tenant is None and args.queue is not None:
        raise InvalidInput("--queue goes with --tenant")
    if args.tenant is not None:
        with open_app(args) as app:
            n = app.cancel_tenant(args.tenant, queue=args.queue, limit=args.limit)
        where = f" in queue {args.queue}" if args.queue else ""
        print(f"cancelled {n} queued job(s) of tenant {shown(args.tenant)}{shown(where)}")
        if n == args.limit:
            print(f"--limit {args.limit} reached: more may remain; run again")
        return EXIT_OK
    with open_app(args) as app:
        if app.cancel(args.id):
            print(f"cancelled job {args.id}")
            return EXIT_OK
        info = app.job(args.id)
    why = ("no such job" if info is None
           else f"it is {info.status}; only queued jobs can be cancelled")
    print(f"fairq cancel: job {args.id} not cancelled: {why}", file=sys.stderr)
    return EXIT_USAGE if info is None else EXIT_ERROR


def run_prune(args: argparse.Namespace) -> int:
    with open_app(args) as app:
        deleted = app.store.prune_finished(args.older_than)
    print(f"deleted {deleted} finished job(s) older than {args.older_than:g}s")
    return EXIT_OK
