"""The public Python API: ``fairq.App``, tasks, enqueueing and tenant configuration."""

from __future__ import annotations

import builtins
import enum
import functools
import inspect
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from fairq import validation as v
from fairq.config import resolve_dsn, resolve_schema
from fairq.errors import InvalidInput
from fairq.models import GroupConfig, JobInfo, NewJob, NewJobColumns, TenantConfig
from fairq.observe import NullObserver, WorkerObserver
from fairq.store import Store

if TYPE_CHECKING:
    from fairq.runtime import Worker
    from fairq.runtime.periodic import Periodic
    from fairq.store.aio import AsyncStore

Handler = Callable[..., Any]


@dataclass(frozen=True)
class Task:
    """A registered handler and its defaults; ``task.enqueue(...)`` is ``app.enqueue(name, ...)``."""

    app: App
    name: str
    fn: Handler
    queue: str
    max_attempts: int
    lease: int
    priority: int
    cost: float

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def enqueue(self, *, tenant: str, payload: Any = None, **options: Any) -> int:
        return self.app.enqueue(self.name, tenant=tenant, payload=payload, **options)

    async def enqueue_async(self, *, tenant: str, payload: Any = None, **options: Any) -> int:
        return await self.app.enqueue_async(self.name, tenant=tenant, payload=payload, **options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def _module_name(fn: Handler) -> str:
    """The module part of a task's default name: the name a worker that imports the module finds.

    A script run as ``python app1.py`` is ``__main__`` here but ``app1`` to ``fairq worker
    app1:app``, so its tasks are named after the file (``-m pkg.mod`` after ``pkg.mod``).
    """
    module = fn.__module__
    if module != "__main__":
        return module
    import sys
    from pathlib import Path

    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name and spec.name != "__main__":
        return str(spec.name).removesuffix(".__main__")
    path = getattr(main, "__file__", None)
    if path and Path(path).suffix == ".py":
        return Path(path).stem
    raise InvalidInput(f"task {fn.__qualname__!r} is defined in __main__ without a file (an "
                       "interactive session?): give it a name, @app.task(name=...), that the "
                       "worker's copy of the code registers too")


def _item(item: Any, index: int) -> tuple[Any, Any, Any]:
    """One ``enqueue_many`` item as (tenant, payload, key): a pair or a triple, nothing else
    (a string would unpack into its characters)."""
    if isinstance(item, tuple | list) and len(item) in (2, 3):
        return (item[0], item[1], item[2] if len(item) == 3 else None)
    raise InvalidInput(f"enqueue_many item {index} must be a (tenant, payload) pair or a "
                       f"(tenant, payload, key) triple, not {type(item).__name__} {item!r:.60}")


class _Keep(enum.Enum):
    """The default of a setting ``tenants.set`` leaves as it is (None means "no limit" there)."""

    KEEP = "keep"


KEEP = _Keep.KEEP


class Tenants:
    """Operators' side: weights and caps, effective from the next claim (no restart)."""

    def __init__(self, app: App) -> None:
        self._app = app

    def set(self, tenant: str, *, weight: float | None = None,
            max_running: int | None = None, rate: float | _Keep | None = KEEP,
            burst: int | _Keep | None = KEEP, group: str | _Keep | None = KEEP) -> TenantConfig:
        """Set a tenant's weight, cap and/or rate limit; unset fields keep their current value.

        ``rate`` is jobs started per second in each queue (``rate=None`` removes the limit) and
        ``burst`` how many may start at once after idling (default: one second's worth).
        ``group`` is a group made with ``app.groups.set`` (None: the group 'default').
        """
        v.name("tenant", tenant)
        new_weight = v.weight(weight) if weight is not None else None  # checked before any query
        new_cap = v.max_running(max_running) if max_running is not None else None
        if rate is not KEEP and rate is not None:
            v.rate(rate)
        if burst is not KEEP and burst is not None:
            v.burst(burst)
        if group is not KEEP and group is not None:
            v.name("group", group)
            if group not in {g.name for g in self._app.store.list_groups()}:
                raise InvalidInput(f"unknown group {group!r}: create it with groups.set first")
        current = self._app.store.get_tenant(tenant)
        new_rate = current.rate if rate is KEEP else rate
        if burst is not KEEP:
            new_burst = burst
        elif new_rate is None or current.rate is None:
            new_burst = None  # none without a rate; the default for a first rate
        else:
            new_burst = current.burst  # a new rate keeps the bucket's size
        new_rate, new_burst = v.rate_limit(new_rate, new_burst)
        new = TenantConfig(
            tenant,
            new_weight if new_weight is not None else current.weight,
            new_cap if new_cap is not None else current.max_running,
            rate=new_rate, burst=new_burst,
            group=current.group if group is KEEP else group,
        )
        self._app.store.set_tenants([new])
        return new

    def get(self, tenant: str) -> TenantConfig:
        return self._app.store.get_tenant(v.name("tenant", tenant))

    def list(self) -> list[TenantConfig]:
        return self._app.store.list_tenants()

    def reset(self, tenant: str) -> bool:
        """Drop the tenant's own weight and cap (the defaults apply from the next claim), as
        removing it from a tenants file does not. Returns whether it had settings of its own."""
        from fairq.admin import ops

        return ops.reset_tenant(self._app.store, tenant)

    def delete(self, tenant: str) -> bool:
        """Forget the tenant (settings and schedule); ``InvalidInput`` while it has queued or
        running jobs. Returns whether fairq knew it."""
        from fairq.admin import ops

        return ops.delete_tenant(self._app.store, tenant)

    async def get_async(self, tenant: str, *, connection: Any = None) -> TenantConfig:
        return await self._app.astore.get_tenant(v.name("tenant", tenant), connection=connection)

    async def list_async(self, *, connection: Any = None) -> builtins.list[TenantConfig]:
        return await self._app.astore.list_tenants(connection=connection)

    def apply(self, source: str | Any) -> builtins.list[TenantConfig]:
        """Apply a TOML file (path or parsed dict): validated whole first, then all-or-nothing.
        Without a ``[defaults]`` table the defaults stay as they are."""
        from fairq.admin.tenant_file import load_tenant_file_with_groups

        load_tenant_file_with_groups(source)  # a bad file: refused before any query
        defaults, tenants, groups = load_tenant_file_with_groups(
            source, self._app.store.get_tenant_defaults())
        self._app.store.set_tenants(tenants, defaults=defaults, groups=groups)
        return tenants


class Groups:
    """Tenant groups: a group's share follows its weight among the groups with runnable work,
    and its tenants share it by their own weights (docs/algorithm.md, "Tenant groups")."""

    def __init__(self, app: App) -> None:
        self._app = app

    def set(self, group: str, *, weight: float) -> GroupConfig:
        """Create a group or change its weight; every queue's next claim uses it."""
        new = GroupConfig(v.name("group", group), v.weight(weight))
        self._app.store.set_group(new)
        return new

    def get(self, group: str) -> GroupConfig:
        v.name("group", group)
        for g in self._app.store.list_groups():
            if g.name == group:
                return g
        raise InvalidInput(f"unknown group {group!r}")

    def list(self) -> list[GroupConfig]:
        return self._app.store.list_groups()


class App:
    """A fairq application: a database, a schema, and the tasks this process knows.

    ``dsn`` defaults to ``$FAIRQ_DATABASE_URL`` and then to the embedded PostgreSQL;
    ``listen_dsn`` is the direct connection for LISTEN when ``dsn`` goes through a
    transaction-mode pooler; set ``pooler=True`` then, so timeouts are set per
    transaction instead of per session.
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        schema: str | None = None,
        listen_dsn: str | None = None,
        pool_size: int = 4,
        prepare_threshold: int | None = 5,
        observer: WorkerObserver | None = None,
        pooler: bool = False,
    ) -> None:
        self.schema = resolve_schema(schema)
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise InvalidInput(f"pool_size must be an integer >= 1, not {pool_size!r}")
        # Sees every enqueue made through this app (fairq_jobs_enqueued_total). A job enqueued
        # with connection= is counted when the call returns, even if that transaction rolls back.
        self.observer: WorkerObserver = observer or NullObserver()
        self._dsn = dsn
        self._listen_dsn = listen_dsn
        self._pool_size = pool_size
        self._prepare_threshold = prepare_threshold
        self.pooler = pooler
        self._store: Store | None = None
        self._astore: AsyncStore | None = None
        self.tasks: dict[str, Task] = {}
        self.tenants = Tenants(self)
        self.periodics: dict[tuple[str, str], Periodic] = {}  # by (name, tenant)
        self.groups = Groups(self)

    # -- connection ----------------------------------------------------------------------
    @functools.cached_property
    def dsn(self) -> str:
        return resolve_dsn(self._dsn)

    @property
    def listen_dsn(self) -> str:
        return self._listen_dsn or self.dsn

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store(self.dsn, self.schema, max_size=self._pool_size,
                                prepare_threshold=self._prepare_threshold, pooler=self.pooler)
        return self._store

    @property
    def astore(self) -> AsyncStore:
        """The store's asyncio part (the ``*_async`` methods); its pool opens on first use."""
        if self._astore is None:
            from fairq.store.aio import AsyncStore

            self._astore = AsyncStore(self.dsn, self.schema, max_size=self._pool_size,
                                      prepare_threshold=self._prepare_threshold,
                                      pooler=self.pooler)
        return self._astore

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
        self._astore = None  # an async pool is closed by aclose(), in its event loop

    async def aclose(self) -> None:
        """Close the async pool (in the event loop that used it) and the sync one."""
        if self._astore is not None:
            await self._astore.close()
        self.close()

    async def __aenter__(self) -> App:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def migrate(self) -> None:
        """Create or upgrade fairq's tables: idempotent and safe from many processes at once."""
        from fairq import migrate

        migrate.upgrade(self.dsn, self.schema)

    # -- tasks ---------------------------------------------------------------------------
    def task(
        self,
        fn: Handler | None = None,
        *,
        name: str | None = None,
        queue: str = "default",
        max_attempts: int = 5,
        lease: int = 300,
        priority: int = 0,
        cost: float = 1.0,
    ) -> Any:
        """Register a handler (``@app.task`` or ``@app.task(queue=..., lease=...)``)."""

        def register(f: Handler) -> Task:
            task_name = v.name("task", name or f"{_module_name(f)}.{f.__qualname__}")
            if task_name in self.tasks:
                raise InvalidInput(f"task {task_name!r} is already registered")
            t = Task(self, task_name, f, v.name("queue", queue), v.max_attempts(max_attempts),
                     v.lease(lease), v.priority(priority), v.cost(cost))
            self.tasks[task_name] = t
            return t

        return register(fn) if fn is not None else register

    def periodic(
        self,
        task: Task | str | None = None,
        *,
        cron: str,
        tenant: str,
        payload: Any = None,
        name: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
    ) -> Any:
        """Enqueue ``task`` for ``tenant`` at each tick of ``cron`` (UTC; 5 fields, or 6 with
        seconds first): ``@app.periodic(cron=..., tenant=...)`` above ``@app.task``, or
        ``app.periodic(task, cron=..., tenant=...)``. One schedule per (name, tenant); ``name``
        defaults to the task's. Workers enqueue each tick once (docs/getting-started.md)."""
        from fairq.runtime import periodic as p

        def declare(t: Task | str) -> Task | str:
            if not isinstance(t, Task | str):
                raise InvalidInput("@app.periodic goes above @app.task (it takes a registered task)")
            task_name = t.name if isinstance(t, Task) else t
            if task_name not in self.tasks:
                raise InvalidInput(f"periodic: task {task_name!r} is not registered with this app")
            key = p.check_key(name or task_name, tenant)
            if key in self.periodics:
                raise InvalidInput(f"periodic: a schedule named {key[0]!r} for tenant {key[1]!r} "
                                   "is already declared (give one of them another name=)")
            job = self._new_job(task_name, tenant, payload, run_at=None, delay=None,
                                priority=priority, cost=None, queue=queue)
            self.periodics[key] = p.Periodic(key[0], key[1], task_name, p.cron(cron), job)
            return t

        return declare(task) if task is not None else declare

    # -- producers -----------------------------------------------------------------------
    def _new_job(self, task: str, tenant: str, payload: Any, *, run_at: datetime | None,
                 delay: float | timedelta | None, priority: int | None, cost: float | None,
                 queue: str | None, max_attempts: int | None = None,
                 lease: int | None = None, key: str | None = None) -> NewJob:
        v.name("task", task)
        registered = self.tasks.get(task)
        if registered is None and self.tasks:
            raise InvalidInput(
                f"unknown task {task!r}: this app registers {', '.join(sorted(self.tasks))}"
            )
        v.run_at(run_at, delay)
        return NewJob(
            task=task,
            tenant=v.name("tenant", tenant),
            payload_json=v.payload({} if payload is None else payload),
            queue=v.name("queue", queue if queue is not None
                         else (registered.queue if registered else "default")),
            priority=v.priority(priority if priority is not None
                                else (registered.priority if registered else 0)),
            cost=v.cost(cost if cost is not None else (registered.cost if registered else 1.0)),
            run_at=run_at,
            delay=v.delay_seconds(delay),
            max_attempts=v.max_attempts(max_attempts if max_attempts is not None
                                        else (registered.max_attempts if registered else 5)),
            lease_seconds=v.lease(lease if lease is not None
                                  else (registered.lease if registered else 300)),
            key=None if key is None else v.name("key", key),
        )

    def enqueue(
        self,
        task: str,
        *,
        tenant: str,
        payload: Any = None,
        run_at: datetime | None = None,
        delay: float | timedelta | None = None,
        priority: int | None = None,
        cost: float | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        lease: int | None = None,
        connection: Any = None,
        key: str | None = None,
    ) -> int:
        """Enqueue one job; with ``connection=`` it commits or rolls back with that transaction.

        With ``key``, while a job of this task with that key is queued or running, its id is
        returned and nothing is written (docs/producers.md).
        """
        job = self._new_job(task, tenant, payload, run_at=run_at, delay=delay, priority=priority,
                            cost=cost, queue=queue, max_attempts=max_attempts, lease=lease,
                            key=key)
        job_id = self.store.enqueue([job], connection=connection)[0]
        self.observer.on_enqueue(job.queue, job.tenant, 1)
        return job_id

    async def enqueue_async(
        self,
        task: str,
        *,
        tenant: str,
        payload: Any = None,
        run_at: datetime | None = None,
        delay: float | timedelta | None = None,
        priority: int | None = None,
        cost: float | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        lease: int | None = None,
        connection: Any = None,
        key: str | None = None,
    ) -> int:
        """``enqueue`` for asyncio: ``connection=`` is a psycopg ``AsyncConnection``, a
        SQLAlchemy ``AsyncConnection`` or ``AsyncSession``, whose transaction the job joins."""
        job = self._new_job(task, tenant, payload, run_at=run_at, delay=delay, priority=priority,
                            cost=cost, queue=queue, max_attempts=max_attempts, lease=lease,
                            key=key)
        job_id = (await self.astore.enqueue(NewJobColumns.of([job]), connection=connection))[0]
        self.observer.on_enqueue(job.queue, job.tenant, 1)
        return job_id

    def enqueue_many(
        self,
        task: str,
        items: Iterable[tuple[str, Any]],
        *,
        run_at: datetime | None = None,
        delay: float | timedelta | None = None,
        priority: int | None = None,
        cost: float | None = None,
        queue: str | None = None,
        connection: Any = None,
    ) -> list[int]:
        """Enqueue ``(tenant, payload)`` pairs, or ``(tenant, payload, key)`` triples (a key as
        in ``enqueue``): one round trip per chunk of 5,000, all validated first."""
        jobs = self._columns(task, items, run_at=run_at, delay=delay, priority=priority,
                             cost=cost, queue=queue)
        if not jobs:
            return []
        ids = self.store.enqueue(jobs, connection=connection)
        self._count(jobs)
        return ids

    async def enqueue_many_async(
        self,
        task: str,
        items: Iterable[tuple[str, Any]],
        *,
        run_at: datetime | None = None,
        delay: float | timedelta | None = None,
        priority: int | None = None,
        cost: float | None = None,
        queue: str | None = None,
        connection: Any = None,
    ) -> list[int]:
        """``enqueue_many`` for asyncio (``connection=`` as in ``enqueue_async``)."""
        jobs = self._columns(task, items, run_at=run_at, delay=delay, priority=priority,
                             cost=cost, queue=queue)
        if not jobs:
            return []
        ids = await self.astore.enqueue(jobs, connection=connection)
        self._count(jobs)
        return ids

    def _count(self, jobs: NewJobColumns) -> None:
        for t, count in Counter(jobs.tenants).items():
            self.observer.on_enqueue(jobs.queues[0], t, count)

    def _columns(self, task: str, items: Iterable[tuple[str, Any]], *,
                 run_at: datetime | None, delay: float | timedelta | None,
                 priority: int | None, cost: float | None,
                 queue: str | None) -> NewJobColumns:
        """``enqueue_many``'s items, validated, as the columns the store sends."""
        pairs = iter(items)
        first_pair = next(pairs, None)
        if first_pair is None:
            return NewJobColumns.of([])
        # The first job goes through every check (so errors come in enqueue's order); the rest
        # share its task, queue and options and differ only in tenant, payload and key.
        tenant0, payload0, key0 = _item(first_pair, 0)
        first = self._new_job(task, tenant0, payload0, run_at=run_at, delay=delay,
                              priority=priority, cost=cost, queue=queue, key=key0)
        tenants = [first.tenant]
        payloads = [first.payload_json]
        keys: list[str | None] = [first.key]
        valid_tenants = {first.tenant}
        check_name, check_payload = v.name, v.payload
        for item in pairs:
            if type(item) is tuple and len(item) == 2:  # the common shape, checked cheaply
                tenant, payload = item
                key = None
            else:
                tenant, payload, key = _item(item, len(tenants))
                if key is not None:
                    check_name("key", key)
            if type(tenant) is not str or tenant not in valid_tenants:
                valid_tenants.add(check_name("tenant", tenant))
            tenants.append(tenant)
            payloads.append(check_payload({} if payload is None else payload))
            keys.append(key)
        n = len(tenants)
        return NewJobColumns(
            tasks=[first.task] * n, tenants=tenants, payloads_json=payloads,
            queues=[first.queue] * n, priorities=[first.priority] * n, costs=[first.cost] * n,
            run_ats=[first.run_at] * n, delays=[first.delay] * n,
            max_attempts=[first.max_attempts] * n, lease_seconds=[first.lease_seconds] * n,
            keys=keys if any(k is not None for k in keys) else (),
        )

    # -- jobs ----------------------------------------------------------------------------
    def job(self, job_id: int) -> JobInfo | None:
        """A job's status, attempts, last_error, tenant and timestamps (None if unknown)."""
        return self.store.get_job(v.integer("job id", job_id, 1, 2**63 - 1))

    def cancel(self, job_id: int) -> bool:
        """Cancel a queued job; False if it is running, finished or unknown."""
        return self.store.cancel(v.integer("job id", job_id, 1, 2**63 - 1))

    # -- operators -----------------------------------------------------------------------
    def jobs(self, *, status: str | None = None, tenant: str | None = None,
             task: str | None = None, queue: str | None = None,
             limit: int = 100) -> list[JobInfo]:
        """Jobs matching every filter given, newest first, at most ``limit``."""
        from fairq.admin import ops

        return ops.jobs(self.store, status=status, tenant=tenant, task=task, queue=queue,
                        limit=limit)

    def retry(self, *ids: int, failed: bool = False, tenant: str | None = None,
              limit: int = 1000) -> list[int]:
        """Queue failed (or cancelled) jobs again, due now, attempts reset: the ``ids`` given,
        or with ``failed=True`` up to ``limit`` failed jobs (of ``tenant``). Returns the ids."""
        from fairq.admin import ops

        return ops.retry(self.store, ids, failed=failed, tenant=tenant, limit=limit)

    def cancel_tenant(self, tenant: str, *, queue: str | None = None,
                      limit: int = 100_000) -> int:
        """Cancel a tenant's queued jobs (of ``queue``, or all) in one statement, up to
        ``limit``; running jobs finish. Returns how many were cancelled."""
        from fairq.admin import ops

        return ops.cancel_tenant(self.store, tenant, queue=queue, limit=limit)

    async def job_async(self, job_id: int, *, connection: Any = None) -> JobInfo | None:
        """``job`` for asyncio (``connection=`` as in ``enqueue_async``)."""
        return await self.astore.get_job(v.integer("job id", job_id, 1, 2**63 - 1),
                                         connection=connection)

    async def cancel_async(self, job_id: int, *, connection: Any = None) -> bool:
        """``cancel`` for asyncio (``connection=`` as in ``enqueue_async``)."""
        return await self.astore.cancel(v.integer("job id", job_id, 1, 2**63 - 1),
                                        connection=connection)

    # -- workers -------------------------------------------------------------------------
    def worker(self, **options: Any) -> Worker:
        """A worker running this app's tasks; ``options`` are ``fairq.runtime.WorkerSettings``
        (concurrency, queues, policy, ...). The worker gets the pieces, not the app: this app's
        connection settings, its tasks and its periodic schedules."""
        from fairq.runtime import StoreFactory, Worker, WorkerSettings

        settings = WorkerSettings(**options)  # bad options fail here, before any connection
        stores = StoreFactory(lambda: self.dsn, self.schema, listen_dsn=lambda: self.listen_dsn,
                              prepare_threshold=self._prepare_threshold, pooler=self.pooler)
        return Worker(stores, self.tasks, settings, periodics=self.periodics)
