"""A worker's settings, checked once when it is built, and its connections: the factory that
opens them (and checks the schema's migrations first) and the worker's three pools.

``App.worker`` builds both from the app (its URL, schema, prepared-statement threshold, pooler
mode) and the caller's options; the runtime never sees the ``App`` itself.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fairq import validation as v
from fairq.errors import InvalidInput
from fairq.observe import NullObserver, WorkerObserver
from fairq.policies import DEFAULT_POLICY, Policy, get_policy
from fairq.runtime.maintenance import DEFAULT_VACUUM_INTERVAL
from fairq.runtime.outage import REAP_GRACE_SECONDS
from fairq.runtime.state import log
from fairq.store import Store
from fairq.store.errors import InsufficientPrivilege, OperationalError

# A claim's statement costs the server about as much for 1 job as for dozens: by default a
# round trip may fill every free slot and the jobs claimed ahead (twice the slots), at least 10
# and at most MAX_DEFAULT_BATCH.
DEFAULT_MAX_BATCH = 10
MAX_DEFAULT_BATCH = 256
MAX_CLAIM_AHEAD = 1024  # jobs a worker may hold claimed beyond its slots (same bound as slots)
MAX_CONCURRENCY = 1024  # slots are threads: beyond this the process runs out of them
MAX_SECONDS = 10 * 365 * 86400.0  # any interval, grace or age a worker takes (ten years)


def _seconds(value: object, low: float, *, exclusive: bool = False) -> bool:
    """Whether ``value`` is a number of seconds from ``low`` (excluded if ``exclusive``) up to
    MAX_SECONDS: ``inf`` and ``nan`` would make the loop's waits and dates fail later."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return (value > low if exclusive else value >= low) and value <= MAX_SECONDS


@dataclass
class WorkerSettings:
    """The options of ``App.worker`` (see ``fairq.runtime.Worker``), checked on creation.

    ``policy`` may be a name; it is resolved here, once. ``batch`` None means twice the slots,
    from DEFAULT_MAX_BATCH to MAX_DEFAULT_BATCH (``max_batch``); ``queues`` None means the
    queues of the worker's tasks. ``claim_ahead`` None means as many as the slots, at most one
    batch (``ahead``); 0 never claims ahead (see ``fairq.runtime.loop``).
    """

    concurrency: int = 8
    queues: Sequence[str] | None = None
    policy: str | Policy = DEFAULT_POLICY
    batch: int | None = None
    poll_interval: float = 5.0
    listen: bool = True
    heartbeat_interval: float | None = None
    reap_interval: float = 5.0
    wake_interval: float = 1.0
    stranded_interval: float = 30.0
    vacuum_interval: float = DEFAULT_VACUUM_INTERVAL
    prune_after: float | None = None
    prune_interval: float = 60.0
    grace_period: float = 30.0
    observer: WorkerObserver | None = None
    worker_id: str | None = None
    max_backoff: float = 30.0
    durable_finishes: bool = False
    claim_ahead: int | None = None
    # Seconds after which half of a backlogged tenant's lead in virtual time is forgotten (the
    # worker's queues, whatever its policy; None: never).
    time_half_life: float | None = None
    # Seconds this process must have been connected before its reaper returns expired leases
    # (decision 016): after an outage the live workers renew theirs first.
    reap_grace: float = REAP_GRACE_SECONDS

    def __post_init__(self) -> None:
        concurrency, batch = self.concurrency, self.batch
        if (isinstance(concurrency, bool) or not isinstance(concurrency, int)
                or not 1 <= concurrency <= MAX_CONCURRENCY):
            raise InvalidInput(f"concurrency must be an integer from 1 to {MAX_CONCURRENCY} "
                               f"(one thread each), not {concurrency!r}")
        if batch is not None and (not isinstance(batch, int) or batch < 1):
            raise InvalidInput(f"batch must be an integer >= 1, not {batch!r}")
        ahead = self.claim_ahead
        if ahead is not None and (isinstance(ahead, bool) or not isinstance(ahead, int)
                                  or not 0 <= ahead <= MAX_CLAIM_AHEAD):
            raise InvalidInput(f"claim_ahead must be an integer from 0 to {MAX_CLAIM_AHEAD} "
                               f"(jobs held claimed beyond the slots), not {ahead!r}")
        for label in ("poll_interval", "reap_interval", "wake_interval", "stranded_interval",
                      "vacuum_interval", "prune_interval", "max_backoff"):
            value = getattr(self, label)
            if not _seconds(value, 0, exclusive=True):
                raise InvalidInput(f"{label} must be a number of seconds > 0 and at most "
                                   f"{MAX_SECONDS:g}, not {value!r}")
        hb = self.heartbeat_interval
        if hb is not None and not _seconds(hb, 0, exclusive=True):
            raise InvalidInput(f"heartbeat_interval must be > 0 and at most {MAX_SECONDS:g} "
                               f"seconds, not {hb!r}")
        if not _seconds(self.reap_grace, 0):
            raise InvalidInput(f"reap_grace must be >= 0 and at most {MAX_SECONDS:g} seconds, "
                               f"not {self.reap_grace!r}")
        if not _seconds(self.grace_period, 0):
            raise InvalidInput(f"grace_period must be >= 0 and at most {MAX_SECONDS:g} seconds, "
                               f"not {self.grace_period!r}")
        if self.prune_after is not None and not _seconds(self.prune_after, 0):
            raise InvalidInput(f"prune_after must be >= 0 and at most {MAX_SECONDS:g} seconds, "
                               f"not {self.prune_after!r}")
        hl = self.time_half_life
        if hl is not None and not _seconds(hl, 0, exclusive=True):
            raise InvalidInput(f"time_half_life must be a number of seconds > 0 and at most "
                               f"{MAX_SECONDS:g}, not {hl!r}")
        if isinstance(self.queues, str):
            raise InvalidInput(f"queues must be a list of queue names, not the string "
                               f"{self.queues!r}")
        if self.queues is not None:
            self.queues = list(dict.fromkeys(v.name("queue", q) for q in self.queues))
        self.policy = get_policy(self.policy)
        self.observer = self.observer or NullObserver()

    @property
    def claim_policy(self) -> Policy:
        """The resolved policy (``policy`` after creation, typed)."""
        return get_policy(self.policy)

    @property
    def max_batch(self) -> int:
        return self.batch or max(DEFAULT_MAX_BATCH, min(2 * self.concurrency, MAX_DEFAULT_BATCH))

    @property
    def ahead(self) -> int:
        """Jobs the worker may hold claimed beyond its slots while its jobs are short: enough
        that a freed slot finds one waiting during the next claim's round trip, and that a
        claim fills a batch; no more than the slots, so that a job waits locally for at most
        one job's run."""
        if self.claim_ahead is not None:
            return self.claim_ahead
        return min(self.max_batch, self.concurrency)


class StoreFactory:
    """Opens the worker's connections: the database URL, schema and connection options, the
    URL resolved on first use (an ``App`` without one starts the embedded server only then)."""

    def __init__(self, dsn: str | Callable[[], str], schema: str, *,
                 listen_dsn: str | Callable[[], str] | None = None,
                 prepare_threshold: int | None = 5, pooler: bool = False) -> None:
        self._dsn = dsn
        self._listen_dsn = listen_dsn
        self.schema = schema
        self.prepare_threshold = prepare_threshold
        self.pooler = pooler

    @functools.cached_property
    def dsn(self) -> str:
        return self._dsn if isinstance(self._dsn, str) else self._dsn()

    @functools.cached_property
    def listen_dsn(self) -> str:
        """The direct connection for LISTEN (``dsn`` unless it goes through a pooler)."""
        if self._listen_dsn is None:
            return self.dsn
        return self._listen_dsn if isinstance(self._listen_dsn, str) else self._listen_dsn()

    def check_schema(self) -> None:
        """Refuse an unmigrated or outdated schema at once, with what to do, rather than
        retrying its statements' errors forever (``ConfigurationError``)."""
        from fairq import migrate  # Alembic: only when a worker starts

        try:
            migrate.require_current(self.dsn, self.schema)
        except InsufficientPrivilege:
            log.warning("cannot read %s.alembic_version to check the schema's revision (grant "
                        "it with `fairq roles --apply`); starting unchecked", self.schema)
        except OperationalError as e:  # the database is away: the loop waits for it
            log.warning("could not check the schema's migrations (%s); starting anyway",
                        str(e).strip()[:200])

    def open(self, application_name: str, *, max_size: int, durable_commits: bool = True
             ) -> Store:
        """A pool of at most ``max_size`` connections named ``application_name``."""
        return Store(self.dsn, self.schema, min_size=1, max_size=max_size,
                     application_name=application_name, timeout=5.0,
                     prepare_threshold=self.prepare_threshold, pooler=self.pooler,
                     durable_commits=durable_commits)


class WorkerStores:
    """A worker's pools, named after it in ``pg_stat_activity``, each opened on first use:
    the control thread's, the finisher's and the heartbeat thread's."""

    def __init__(self, factory: StoreFactory, application_name: str, *, concurrency: int,
                 durable_finishes: bool, on_lost: Callable[[], None] | None = None) -> None:
        self.factory = factory
        # Called when a pool finds an idle connection the server ended (fairq.store.pool): the
        # server may have crashed without any statement of ours failing.
        self.on_lost = on_lost
        self.application_name = application_name
        self.concurrency = concurrency
        self.durable_finishes = durable_finishes
        self._main: Store | None = None
        self._finish: Store | None = None
        self._heartbeat: Store | None = None

    @property
    def main(self) -> Store:
        """Claims and maintenance: a few connections (``Job.extend_lease`` uses them too)."""
        if self._main is None:
            self._main = self._watched(self.factory.open(self.application_name,
                                                         max_size=2 + min(self.concurrency, 4)))
        return self._main

    @property
    def finish(self) -> Store:
        """The finisher's connection: commits without waiting for the WAL flush, unless
        ``durable_finishes``. A database crash may then undo the last finishes of a fraction of
        a second; those jobs are still running under their leases, so the reaper runs them again:
        a re-run, as after a worker crash, never a lost job. Their tenants' slots come back with
        them (same transaction). Claims, enqueues and reaps stay durable."""
        if self._finish is None:
            self._finish = self._watched(self.factory.open(
                self.application_name, max_size=1, durable_commits=self.durable_finishes))
        return self._finish

    @property
    def heartbeat(self) -> Store:
        """The heartbeat thread's own connection: a claim waiting for a lock, or any slow
        statement of the control thread, cannot delay the leases of running jobs."""
        if self._heartbeat is None:
            self._heartbeat = self._watched(self.factory.open(self.application_name,
                                                              max_size=1))
        return self._heartbeat

    def _watched(self, store: Store) -> Store:
        store.pool.on_lost = self.on_lost
        return store

    def opened(self) -> bool:
        """Whether the control thread's pool was opened."""
        return self._main is not None

    def close(self) -> None:
        for store in (self._main, self._finish, self._heartbeat):
            if store is not None:
                store.close()
        self._main = self._finish = self._heartbeat = None
