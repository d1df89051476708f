"""The ``fairq`` command line: one module per command group, each registering its own subparser.

Adding a command group is one line: put its module name in ``COMMANDS``. A module listed there
defines ``register(subparsers, common)``; it adds its parser(s) with ``parents=[common]`` and
sets ``handler=`` to a function ``(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from fairq.cli._common import (
    EXIT_USAGE,
    Parser,
    add_connection_options,
    report_error,
)
from fairq.cli.safe_text import safe_output

COMMANDS: tuple[str, ...] = (
    "migrate",
    "worker",
    "jobs",
    "ops",
    "tenants",
    "groups",
    "stats",
    "exporter",
    "demo",
    "bench",
    "roles",
    "periodic",
    "web",
)


class VersionAction(argparse.Action):
    """``--version``: fairq's version and the schema revision it expects. The revision is read
    from the migrations shipped with this fairq, when asked (loading them costs a little)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=default,
                         help=help or "print fairq's version and the schema revision it expects")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        print(version_line())
        parser.exit()


def version_line() -> str:
    """``fairq 0.1.0 (schema revision 0001)``."""
    from fairq import __version__, migrate

    return f"fairq {__version__} (schema revision {migrate.head()})"


def build_parser() -> argparse.ArgumentParser:
    """The full parser: global options plus every available command group."""
    common = Parser(add_help=False)
    add_connection_options(common)
    parser = Parser(
        prog="fairq",
        description="Multi-tenant fair job scheduler on PostgreSQL.",
        parents=[common],
        epilog="Exit codes: 0 success, 2 usage or bad input, 1 anything else. "
        "FAIRQ_DEBUG=1 shows tracebacks.",
    )
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 success, 2 usage or bad input, 1 anything else)."""
    with safe_output():  # names are a producer's data: no control sequence reaches a terminal
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:  # --help, --version, or a usage error already reported
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        code: int = args.handler(args)
        return code
    except KeyboardInterrupt:
        print("fairq: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if os.environ.get("FAIRQ_DEBUG") == "1":
            import traceback

            traceback.print_exc()
        return report_error(args, exc)


__all__ = ["COMMANDS", "build_parser", "main", "version_line"]
