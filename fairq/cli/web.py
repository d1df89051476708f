"""``fairq web``: the operator console (``pip install 'fairq[web]'``), served by uvicorn.

Read-only unless ``--allow-actions``; actions and any non-loopback bind need ``FAIRQ_WEB_TOKEN``
(docs/web.md). ``--demo`` also runs the demo's live workload (a capped noisy tenant, small
tenants waiting their turn, a rate-limited one and a failed job) in this process, in the
schema ``fairq_demo``, and shows that schema.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import secrets
import sys
from typing import TYPE_CHECKING

from fairq.cli._common import EXIT_OK, EXIT_USAGE, MAX_PORT, check_connection, integer, resolve
from fairq.errors import InvalidInput

if TYPE_CHECKING:
    from fairq.cli._common import Subparsers

EXTRA = "pip install 'fairq[web]'"
NEEDS = ("starlette", "jinja2", "uvicorn", "multipart")


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "web", parents=[common], help="the operator console in a browser (fairq[web])",
        description="Serve the operator console: overview, tenants (share, wait and why their "
        "next job has not started), jobs, and with --allow-actions retry, cancel and tenant "
        "settings. Every page is also JSON under /api/. Needs " + EXTRA + ".")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; any other needs FAIRQ_WEB_TOKEN)")
    p.add_argument("--port", type=integer("port", minimum=1, maximum=MAX_PORT), default=8080,
                   help="port (default 8080)")
    p.add_argument("--allow-actions", action="store_true",
                   help="allow retry, cancel and tenant settings (needs FAIRQ_WEB_TOKEN and a "
                        "login)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="a Host header to accept besides the loopback names and --host (the "
                        "name a reverse proxy forwards); repeatable")
    p.add_argument("--demo", action="store_true",
                   help="also run the demo's live workload and show it (schema fairq_demo); "
                        "implies --allow-actions, with a token made for this run if "
                        "FAIRQ_WEB_TOKEN is unset")
    p.set_defaults(handler=run)


def missing_extra() -> str | None:
    """The first package of the web extra that is not installed (None: all are)."""
    for name in NEEDS:
        if importlib.util.find_spec(name) is None:
            return name
    return None


def run(args: argparse.Namespace) -> int:
    from fairq.web import security as sec

    missing = missing_extra()
    if missing is not None:
        print(f"fairq web: the console needs the web extra ({missing} is missing): {EXTRA}",
              file=sys.stderr)
        return EXIT_USAGE
    token = sec.check_token(os.environ.get(sec.TOKEN_ENV))
    allow = args.allow_actions or args.demo
    made_token = False
    if args.demo and token is None and sec.is_loopback(args.host):
        token, made_token = secrets.token_urlsafe(18), True
    sec.check_bind(args.host, token, allow)
    for name in args.allowed_host:
        if not name or any(c in name for c in "/ \\@"):
            raise InvalidInput(f"--allowed-host must be a host name, not {name!r}")
    dsn, schema = resolve(args)
    check_connection(dsn)
    return serve(args, dsn, schema, token, allow, made_token)


def serve(args: argparse.Namespace, dsn: str, schema: str, token: str | None, allow: bool,
          made_token: bool) -> int:
    import uvicorn

    from fairq.app import App
    from fairq.web import security as sec
    from fairq.web.server import create_app

    demo = None
    if args.demo:
        from fairq.cli.demo import CONSOLE_SCHEMA, LiveDemo

        schema = CONSOLE_SCHEMA
        demo = LiveDemo(dsn, schema)
        demo.start()
    app = App(dsn, schema=schema, pool_size=4)
    try:
        guard = sec.Guard(token, allow, login_required=not sec.is_loopback(args.host))
        web = create_app(app, guard=guard,
                         hosts=sec.allowed_hosts(args.host, args.allowed_host))
        config = uvicorn.Config(web, host=args.host, port=args.port, log_level="warning",
                                server_header=False, proxy_headers=False)
        server = uvicorn.Server(config)
        host = f"[{args.host}]" if ":" in args.host else args.host
        mode = "actions allowed (log in with the token)" if allow else "read-only"
        print(f"fairq web: serving schema {schema} on http://{host}:{args.port}/ ({mode}); "
              "Ctrl-C stops it", flush=True)
        if demo is not None:
            print("fairq web: the demo's workload runs in this process: tenant-1 at its cap, "
                  "tenant-2 rate limited, tenant-3..7 waiting their turn, a failed job of "
                  "tenant-3 to retry", flush=True)
        if made_token:
            print(f"fairq web: token for this run (set FAIRQ_WEB_TOKEN to choose one): {token}",
                  flush=True)
        server.run()
    finally:
        app.close()
        if demo is not None:
            demo.stop()
    return EXIT_OK
