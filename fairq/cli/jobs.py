"""``fairq enqueue``, ``fairq job``, ``fairq cancel``, ``fairq prune``: jobs from the shell."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from fairq.cli._common import (
    EXIT_ERROR,
    EXIT_OK,
    integer,
    json_argument,
    number,
    open_app,
    print_json,
)

if TYPE_CHECKING:
    from fairq.cli._common import Subparsers

DEFAULT_PRUNE_AGE = 7 * 86400


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    e = sub.add_parser("enqueue", parents=[common], help="enqueue one job; prints its id",
                       description="Enqueue one job by task name; prints the job id.")
    e.add_argument("task", metavar="TASK", help="task name, e.g. reports.send_report")
    e.add_argument("--tenant", required=True)
    e.add_argument("--payload", type=json_argument("payload"), default=None, metavar="JSON",
                   help="JSON payload (default {})")
    e.add_argument("--delay", type=number("delay", minimum=0), metavar="SECONDS",
                   help="run no earlier than this many seconds from now (database clock)")
    e.add_argument("--priority", type=integer("priority"), help="higher runs first within a tenant")
    e.add_argument("--queue", help="queue name (default: default)")
    e.add_argument("--cost", type=number("cost"), help="work units, for the drr policy (default 1)")
    e.add_argument("--key", help="idempotency key: while a job of this task with this key is "
                                 "queued or running, print its id and enqueue nothing")
    e.set_defaults(handler=run_enqueue)

    j = sub.add_parser("job", parents=[common], help="show a job as JSON")
    j.add_argument("id", type=integer("job id", minimum=1), metavar="ID")
    j.set_defaults(handler=run_job)

    c = sub.add_parser("cancel", parents=[common], help="cancel a queued job")
    c.add_argument("id", type=integer("job id", minimum=1), metavar="ID")
    c.set_defaults(handler=run_cancel)

    p = sub.add_parser("prune", parents=[common], help="delete finished jobs older than an age")
    p.add_argument("--older-than", type=number("older-than", minimum=0), default=DEFAULT_PRUNE_AGE,
                   metavar="SECONDS",
                   help=f"age of finished jobs to delete (default {DEFAULT_PRUNE_AGE})")
    p.set_defaults(handler=run_prune)


def run_enqueue(args: argparse.Namespace) -> int:
    with open_app(args) as app:
        job_id = app.enqueue(args.task, tenant=args.tenant, payload=args.payload, delay=args.delay,
                             priority=args.priority, queue=args.queue, cost=args.cost,
                             key=args.key)
    print(job_id)
    return EXIT_OK


def run_job(args: argparse.Namespace) -> int:
    import sys

    with open_app(args) as app:
        info = app.job(args.id)
    if info is None:
        print(f"fairq job: no job {args.id}", file=sys.stderr)
        return EXIT_ERROR
    print_json(info)
    return EXIT_OK


def run_cancel(args: argparse.Namespace) -> int:
    import sys

    with open_app(args) as app:
        if app.cancel(args.id):
            print(f"cancelled job {args.id}")
            return EXIT_OK
        info = app.job(args.id)
    why = ("no such job" if info is None
           else f"it is {info.status}; only queued jobs can be cancelled")
    print(f"fairq cancel: job {args.id} not cancelled: {why}", file=sys.stderr)
    return EXIT_ERROR


def run_prune(args: argparse.Namespace) -> int:
    with open_app(args) as app:
        deleted = app.store.prune_finished(args.older_than)
    print(f"deleted {deleted} finished job(s) older than {args.older_than:g}s")
    return EXIT_OK
