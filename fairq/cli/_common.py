"""Shared plumbing of the CLI: one-line errors, exit codes, connection options, output."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any, NoReturn

from fairq import validation as v
from fairq.cli.safe_text import json_safe, shown
from fairq.config import ENV_SCHEMA, ENV_URL, redact
from fairq.errors import ConfigurationError, InvalidInput

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
MAX_PORT = 65535
MAX_ERROR_CHARS = 500  # an error line longer than this is cut, saying how long it was

Handler = Callable[[argparse.Namespace], int]
if TYPE_CHECKING:
    from typing import TypeAlias

    # What ``register(subparsers, common)`` receives: the result of ``add_subparsers()``.
    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr, exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {one_line(message)} (see {self.prog} --help)\n")


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    """``--dsn`` and ``--schema``, accepted before or after the command name."""
    parser.add_argument(
        "--dsn", default=argparse.SUPPRESS, metavar="URL",
        help=f"PostgreSQL URL (default: ${ENV_URL}, else the embedded server)",
    )
    parser.add_argument(
        "--schema", default=argparse.SUPPRESS,
        help=f"PostgreSQL schema holding fairq's tables (default: ${ENV_SCHEMA}, else fairq)",
    )


def one_line(text: object) -> str:
    """Collapse a (possibly multi-line) message into one line."""
    return " ".join(str(text).split())


# -- secrets -------------------------------------------------------------------------------
def _passwords(dsn: str) -> list[str]:
    """Passwords a DSN carries (URL userinfo or ``password=``), to scrub them from messages."""
    import re

    # Any "password=" in it, even where neither parser below makes sense of the text.
    found: list[str] = [m.strip("'") for m in re.findall(r"password\s*=\s*('[^']*'|\S+)", dsn,
                                                          flags=re.IGNORECASE)]
    try:
        from fairq.config import dsn_fields

        pw = dsn_fields(dsn).get("password")
        if pw:
            found.append(str(pw))
    except Exception:
        pass
    if "://" in dsn:
        from urllib.parse import unquote, urlsplit

        try:
            pw = urlsplit(dsn).password
        except ValueError:
            pw = None
        if pw:
            found += [pw, unquote(pw)]
    return [p for p in found if p]


def scrub(message: str, args: argparse.Namespace | None = None) -> str:
    """``message`` without any password of the DSNs in play (``--dsn``, ``$FAIRQ_DATABASE_URL``)."""
    dsns = [getattr(args, "dsn", None) if args is not None else None, os.environ.get(ENV_URL)]
    for dsn in filter(None, dsns):
        message = message.replace(dsn, redact(dsn))
        for pw in sorted(_passwords(dsn), key=len, reverse=True):
            message = message.replace(pw, "***")
    return message


def report_error(args: argparse.Namespace, exc: BaseException) -> int:
    """Print ``exc`` as one scrubbed line and return its exit code."""
    code = EXIT_USAGE if isinstance(exc, InvalidInput) else EXIT_ERROR
    text = str(exc) or type(exc).__name__
    if not isinstance(exc, InvalidInput | ConfigurationError):
        text = _explain(exc, text)
    # "fairq tenants set": the command and any nested action (``<group>_command`` dests).
    words = [getattr(args, "command", None)] + [
        getattr(args, k) for k in sorted(vars(args)) if k.endswith("_command")]
    prog = " ".join(["fairq", *(w for w in words if w)])
    line = shown(scrub(one_line(text), args))
    if len(line) > MAX_ERROR_CHARS:  # an oversized value (a 100 KB --payload) is not echoed whole
        line = f"{line[:MAX_ERROR_CHARS]}... ({len(line):,} characters in all)"
    print(f"{prog}: {line}", file=sys.stderr)
    return code


def _explain(exc: BaseException, text: str) -> str:
    """Turn the database errors users actually meet into advice."""
    from fairq.store import errors

    if isinstance(exc, errors.UndefinedTable | errors.InvalidSchemaName):
        return f"fairq's tables are missing ({one_line(text)}): run `fairq migrate` first"
    if isinstance(exc, errors.QueryCanceled):
        return f"the query took too long and was cancelled ({one_line(text)})"
    from fairq.embedded import EmbeddedUnavailable

    if isinstance(exc, EmbeddedUnavailable | OSError):
        return text
    return f"{type(exc).__name__}: {text}"


# -- connecting ----------------------------------------------------------------------------
def resolve(args: argparse.Namespace) -> tuple[str, str]:
    """(dsn, schema) for this invocation; starts the embedded server if nothing is configured."""
    from fairq.config import resolve_dsn, resolve_schema

    schema = resolve_schema(getattr(args, "schema", None))  # validate before starting anything
    return resolve_dsn(getattr(args, "dsn", None)), schema


def check_connection(dsn: str, timeout_s: int = 10) -> None:
    """Connect once: an unreachable database fails in seconds with one line, not a pool timeout."""
    from fairq.store import errors
    from fairq.store.monitor import ping

    try:
        ping(dsn, timeout_s)
    except errors.ProgrammingError as exc:  # malformed connection string
        raise InvalidInput(f"invalid database URL {redact(dsn)}: {one_line(exc)}") from None
    except errors.OperationalError as exc:
        raise ConfigurationError(f"cannot connect to {redact(dsn)}: {one_line(exc)}") from None


@contextmanager
def open_app(args: argparse.Namespace) -> Iterator[Any]:
    """A connected ``fairq.App`` for the options in ``args``, closed afterwards."""
    from fairq.app import App

    dsn, schema = resolve(args)
    check_connection(dsn)
    app = App(dsn, schema=schema, pool_size=2)
    try:
        yield app
    finally:
        app.close()


# -- parsing and output --------------------------------------------------------------------
def json_argument(kind: str) -> Callable[[str], Any]:
    """An argparse type: JSON text, or a one-line usage error."""

    def parse(text: str) -> Any:
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"{kind} is not valid JSON: {exc}") from None
        except RecursionError:
            raise argparse.ArgumentTypeError(f"{kind} is nested too deeply to decode") from None

    return parse


def number(kind: str, *, minimum: float | None = None,
           maximum: float | None = None) -> Callable[[str], float]:
    """An argparse type: a finite number (optionally >= ``minimum``, <= ``maximum``)."""

    def parse(text: str) -> float:
        try:  # strictly: not "5_0", other scripts' digits or "inf" (fairq.validation)
            value = v.parse_number(kind, text)
        except InvalidInput as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{kind} must be finite, not {text!r}")
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"{kind} must be >= {minimum:g}, not {text}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"{kind} must be <= {maximum:g}, not {text}")
        return value

    return parse


def integer(kind: str, *, minimum: int | None = None,
            maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer (optionally >= ``minimum``, <= ``maximum``)."""

    def parse(text: str) -> int:
        try:  # strictly: not "5_0" or other scripts' digits (fairq.validation)
            value = v.parse_integer(kind, text)
        except InvalidInput as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"{kind} must be >= {minimum}, not {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"{kind} must be <= {maximum}, not {value}")
        return value

    return parse


def to_jsonable(value: Any) -> Any:
    """Dataclasses, datetimes and containers as plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, datetime):
        from fairq.store.loaders import OutOfRangeTime

        # A stored time beyond Python's years: the database's own text, not a stand-in's.
        return str(value) if isinstance(value, OutOfRangeTime) else value.isoformat()
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    return value


def print_json(value: Any, out: IO[str] | None = None) -> None:
    print(json_safe(json.dumps(to_jsonable(value), indent=2, ensure_ascii=False,
                               sort_keys=False)), file=out or sys.stdout)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]],
                 right: Sequence[bool] | None = None) -> str:
    """A plain text table; numeric columns (``right``) aligned right."""
    cells = [[str(h) for h in headers]] + [[shown(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    align = right or [False] * len(headers)
    lines = []
    for row in cells:
        parts = [c.rjust(w) if a else c.ljust(w)
                 for c, w, a in zip(row, widths, align, strict=True)]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


LOG_LEVELS = ("debug", "info", "warning", "error")


def add_log_level(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info",
                        help="fairq's log messages on stderr from this level on (default info: "
                             "start, stop, signals, reaped leases; never one line per job)")


def setup_logging(level: str) -> None:
    """fairq's loggers to stderr at ``level``, other libraries' at warning. Nothing is changed
    when the application configured logging itself (the root logger has a handler): its
    configuration wins."""
    root = logging.getLogger()
    if root.handlers:
        return
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("fairq").setLevel(level.upper())
