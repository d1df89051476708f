"""What a worker does about a database error, by kind (``fairq.store.errors.error_kind``): the
line it logs, naming the error and what happens next; how long it waits before trying again;
and whether its pool drops broken connections first (docs/reliability.md, "Database errors").

A deadlock or a serialization failure rolled back one statement while the other side went on:
trying again at once almost always succeeds, so those retry within tens of milliseconds. A
killed session or a restarted server leaves every idle connection of the pool dead, not just the
one that failed: the pool checks them all at once and the worker tries again within at most
``RECONNECT_CAP`` seconds, so it claims again within seconds of the server being back. Timeouts
and unknown errors back off exponentially up to ``max_backoff``.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

from fairq.observe import WorkerObserver
from fairq.store.errors import error_kind

RECONNECT_CAP = 2.0  # the longest wait between tries while the server is away (seconds)
RETRY_CAP = 1.0  # the longest wait after a deadlock or a serialization failure

# The first words of each kind's line: what happened, and what it cost.
WHAT = {
    "deadlock": "deadlock: PostgreSQL rolled this statement back to break a lock cycle with "
                "another session (nothing it wrote was kept)",
    "serialization_failure": "serialization failure: this transaction conflicted with a "
                             "concurrent one and was rolled back (nothing it wrote was kept)",
    "admin_shutdown": "session ended by the server (pg_terminate_backend, a restart or a "
                      "shutdown); dropping the pool's dead connections",
    "connection_lost": "connection lost; dropping the pool's dead connections",
    "statement_timeout": "statement timeout: a statement ran longer than statement_timeout and "
                         "was cancelled",
    "lock_timeout": "lock timeout: a statement waited longer than lock_timeout for a lock "
                    "another session holds",
    "pool_timeout": "pool timeout: no connection from the pool in time (every connection busy, "
                    "or the server unreachable)",
    "other": "database error",
}
RECONNECT_KINDS = frozenset({"admin_shutdown", "connection_lost", "pool_timeout"})


@dataclass(frozen=True)
class Reaction:
    """A worker's answer to one database error."""

    kind: str
    delay: float  # seconds before the next try
    drop_connections: bool  # check the pool's idle connections, dropping the dead ones
    line: str  # what to log

    @property
    def unexpected(self) -> bool:
        """An error of no known kind: logged with its traceback."""
        return self.kind == "other"


def react(error: BaseException, failures: int, max_backoff: float, next_step: str) -> Reaction:
    """The reaction to ``error``, the ``failures``-th in a row (from 1); ``next_step`` says what
    the worker does after the wait (for the log line: "claiming again")."""
    kind = error_kind(error)
    n = max(failures, 1)
    if kind in ("deadlock", "serialization_failure"):
        delay = min(max_backoff, RETRY_CAP, 0.05 * 2 ** min(n - 1, 5))
    elif kind in RECONNECT_KINDS:
        delay = min(max_backoff, RECONNECT_CAP, 0.1 * 2 ** min(n - 1, 12))
    else:
        delay = min(max_backoff, 0.1 * 2 ** min(n, 12))
    delay *= random.uniform(0.5, 1.0)
    text = str(error).strip()
    detail = text.splitlines()[0][:200] if text else "no message"
    line = f"{WHAT[kind]} ({type(error).__name__}: {detail}); {next_step} in {delay:.2f}s"
    return Reaction(kind, delay, kind in RECONNECT_KINDS, line)


def observe(observer: WorkerObserver, kind: str) -> None:
    """Count the error in ``observer``; an observer written before ``on_db_error`` existed
    does without."""
    hook = getattr(observer, "on_db_error", None)
    if hook is not None:
        hook(kind)


def observe_reconnect(observer: WorkerObserver) -> None:
    """Count an outage's end in ``observer`` (``fairq_db_reconnects_total``); an observer
    written before ``on_reconnect`` existed does without."""
    hook = getattr(observer, "on_reconnect", None)
    if hook is not None:
        hook()


# psycopg_pool's lines for each failed connection attempt and each dead connection it drops:
# during an outage that is a line per attempt per pool. The worker says it once (outage.py).
POOL_NOISE = ("error connecting in ", "discarding broken connection", "discarding closed "
              "connection", "closing returned connection")


class PoolNoise(logging.Filter):
    """Drops psycopg_pool's per-attempt warnings; its errors (and anything else) pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno <= logging.WARNING
                    and isinstance(record.msg, str) and record.msg.startswith(POOL_NOISE))


def quiet_pool_logs() -> None:
    """Install ``PoolNoise`` on psycopg_pool's logger, once per process."""
    pool_log = logging.getLogger("psycopg.pool")
    if not any(isinstance(f, PoolNoise) for f in pool_log.filters):
        pool_log.addFilter(PoolNoise())
