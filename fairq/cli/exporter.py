"""``fairq exporter``: serve database-level metrics for Prometheus; no worker needed."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from fairq.cli._common import (
    EXIT_OK,
    MAX_PORT,
    add_log_level,
    check_connection,
    integer,
    number,
    resolve,
    setup_logging,
)

if TYPE_CHECKING:
    from fairq.cli._common import Subparsers
    from fairq.metrics import MetricsServer

DEFAULT_PORT = 9765
DEFAULT_HOST = "127.0.0.1"


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    from fairq.policies import DEFAULT_POLICY, POLICIES

    p = sub.add_parser(
        "exporter", parents=[common], help="database-level metrics for Prometheus",
        description="Serve /metrics (backlog, running vs caps, weights, oldest runnable age, "
        "fairness, expired leases, vacuum health, claim planning vs execution) and /healthz. "
        "The database is read at scrape time, at most once per --interval, under a statement "
        "timeout; a scrape waits for a read at most 1.5 s, then serves the previous one's "
        "values. Run one per database, not one per worker.",
    )
    p.add_argument("--port", type=integer("port", minimum=0, maximum=MAX_PORT), default=DEFAULT_PORT,
                   help=f"port for /metrics and /healthz (default {DEFAULT_PORT})")
    p.add_argument("--host", default=DEFAULT_HOST,
                   help=f"bind address (default {DEFAULT_HOST}: this host only; the metrics name "
                   "tenants and queues, so 0.0.0.0, every interface, only behind a firewall)")
    p.add_argument("--interval", type=number("interval", minimum=0), default=5.0, metavar="S",
                   help="read the database at most every S seconds; scrapes in between get "
                   "the cached values (default 5)")
    p.add_argument("--window", type=number("window", minimum=1), default=300.0, metavar="S",
                   help="fairness window in seconds (default 300)")
    p.add_argument("--statement-timeout", type=integer("statement-timeout", minimum=1),
                   default=5000, metavar="MS", help="per-statement timeout (default 5000 ms)")
    p.add_argument("--max-tenants", type=integer("max-tenants", minimum=0),
                   help="tenants with their own series (default $FAIRQ_METRICS_MAX_TENANTS or 50)")
    p.add_argument("--policy", action="append", dest="policies", choices=sorted(POLICIES),
                   help=f"policy whose claim statement is probed (repeatable; default "
                   f"{DEFAULT_POLICY})")
    p.add_argument("--probe-interval", type=number("probe-interval", minimum=1), default=30.0,
                   metavar="S", help="sampled EXPLAIN ANALYZE at most every S seconds when "
                   "pg_stat_statements is not usable (default 30)")
    p.add_argument("--probe-source", choices=("auto", "pg_stat_statements", "explain_sample"),
                   default="auto", help="where planning/execution times come from (default auto)")
    p.add_argument("--no-probe", action="store_true",
                   help="no claim planning/execution metrics")
    add_log_level(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from fairq.metrics import exporter
    from fairq.policies import DEFAULT_POLICY

    dsn, schema = resolve(args)
    setup_logging(args.log_level)
    check_connection(dsn)

    def ready(server: MetricsServer) -> None:
        print(f"fairq exporter: serving {server.bound_url}/metrics and /healthz "
              f"(schema {schema})", file=sys.stderr, flush=True)

    exporter.run(
        dsn, schema, host=args.host, port=args.port, ready=ready,
        max_tenants=args.max_tenants, interval=args.interval, window=args.window,
        statement_timeout_ms=args.statement_timeout,
        policies=args.policies or [DEFAULT_POLICY], probe_interval=args.probe_interval,
        probe_source=args.probe_source, probe=not args.no_probe,
    )
    return EXIT_OK
