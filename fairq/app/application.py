"""``fairq.App``: a database, a schema and the tasks this process knows; registering tasks and
periodic schedules, enqueueing, reading and operating on jobs, and making workers."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload

from typing_extensions import Unpack

from fairq import validation as v
from fairq.app.depth import QueueDepth, queue_depth
from fairq.app.enqueue import Item, new_job, new_job_chunks, new_jobs
from fairq.app.hooks import AttemptHook, with_hooks
from fairq.app.options import (
    ENQUEUE_OPTIONS,
    MANY_OPTIONS,
    EnqueueOptions,
    ManyOptions,
    check_options,
)
from fairq.app.ports import JobSink
from fairq.app.sink import StoreSink
from fairq.app.task import Task, default_name
from fairq.app.tenants import Groups, Tenants
from fairq.config import resolve_dsn, resolve_schema
from fairq.errors import InvalidInput
from fairq.job import Job
from fairq.models import JobInfo, NewJob, NewJobColumns
from fairq.observe import NullObserver, WorkerObserver
from fairq.store import Store
from fairq.store.enqueue import CHUNK

if TYPE_CHECKING:
    from fairq.admin.ops import Retried
    from fairq.runtime import Worker
    from fairq.runtime.periodic import Periodic
    from fairq.store.aio import AsyncStore

R = TypeVar("R")
Declared = TypeVar("Declared", bound="Task[Any] | str")


class TaskDecorator(Protocol):
    """What ``@app.task(...)`` with options returns: it registers the function below it."""

    def __call__(self, fn: Callable[[Job], R], /) -> Task[R]: ...


class PeriodicDecorator(Protocol):
    """What ``@app.periodic(...)`` returns: it declares a schedule for the task below it and
    hands that task back unchanged, so ``@app.periodic`` lines stack above ``@app.task``."""

    def __call__(self, task: Declared, /) -> Declared: ...


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
        self.tasks: dict[str, Task[Any]] = {}
        self.tenants = Tenants(self)
        self.periodics: dict[tuple[str, str], Periodic] = {}  # by (name, tenant)
        self.groups = Groups(self)
        # Where validated jobs go (fairq.app.ports.JobSink): the database; the test mode's
        # inline sink runs them instead, fairq.otel's stores each enqueue's trace context.
        self.sink: JobSink = StoreSink(self)
        # Context managers around each attempt a worker of this app runs (fairq.app.hooks).
        self.attempt_hooks: list[AttemptHook] = []

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
    @overload
    def task(self, fn: Callable[[Job], R], /, *, name: str | None = None,
             queue: str = "default", max_attempts: int = 5, lease: int = 300,
             priority: int = 0, cost: float = 1.0) -> Task[R]: ...

    @overload
    def task(self, fn: None = None, /, *, name: str | None = None, queue: str = "default",
             max_attempts: int = 5, lease: int = 300, priority: int = 0,
             cost: float = 1.0) -> TaskDecorator: ...

    def task(
        self,
        fn: Callable[[Job], R] | None = None,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        max_attempts: int = 5,
        lease: int = 300,
        priority: int = 0,
        cost: float = 1.0,
    ) -> Task[R] | TaskDecorator:
        """Register a handler (``@app.task`` or ``@app.task(queue=..., lease=...)``), a function
        taking a ``fairq.Job``; its name defaults to ``module.function``."""

        def register(f: Callable[[Job], Any]) -> Task[Any]:
            task_name = v.name("task", name or default_name(f))
            if task_name in self.tasks:
                raise InvalidInput(f"task {task_name!r} is already registered")
            t = Task(self, task_name, f, v.name("queue", queue), v.max_attempts(max_attempts),
                     v.lease(lease), v.priority(priority), v.cost(cost))
            self.tasks[task_name] = t
            return t

        return register(fn) if fn is not None else register

    @overload
    def periodic(self, task: Declared, /, *, cron: str, tenant: str, payload: Any = None,
                 name: str | None = None, queue: str | None = None,
                 priority: int | None = None) -> Declared: ...

    @overload
    def periodic(self, task: None = None, /, *, cron: str, tenant: str, payload: Any = None,
                 name: str | None = None, queue: str | None = None,
                 priority: int | None = None) -> PeriodicDecorator: ...

    def periodic(
        self,
        task: Task[Any] | str | None = None,
        /,
        *,
        cron: str,
        tenant: str,
        payload: Any = None,
        name: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
    ) -> Task[Any] | str | PeriodicDecorator:
        """Enqueue ``task`` for ``tenant`` at each tick of ``cron`` (UTC; 5 fields, or 6 with
        seconds first): ``@app.periodic(cron=..., tenant=...)`` above ``@app.task``, or
        ``app.periodic(task, cron=..., tenant=...)``. One schedule per (name, tenant); ``name``
        defaults to the task's. Workers enqueue each tick once (docs/getting-started.md)."""
        from fairq.runtime import periodic as p

        def declare(t: Declared) -> Declared:
            if not isinstance(t, Task | str):
                raise InvalidInput("@app.periodic goes above @app.task (it takes a registered task)")
            task_name = t.name if isinstance(t, Task) else t
            if task_name not in self.tasks:
                raise InvalidInput(f"periodic: task {task_name!r} is not registered with this app")
            key = p.check_key(name or task_name, tenant)
            if key in self.periodics:
                raise InvalidInput(f"periodic: a schedule named {key[0]!r} for tenant {key[1]!r} "
                                   "is already declared (give one of them another name=)")
            job = new_job(self.tasks, task_name, tenant, payload, run_at=None, delay=None,
                          priority=priority, cost=None, queue=queue)
            self.periodics[key] = p.Periodic(key[0], key[1], task_name, p.cron(cron), job)
            return t

        return declare(task) if task is not None else declare

    # -- producers -----------------------------------------------------------------------
    # The options are fairq.app.options' (one definition); the job goes to ``self.sink``: the
    # database by default, the handler itself under fairq.testing.inline.
    def enqueue(self, task: str, *, tenant: str, **options: Unpack[EnqueueOptions]) -> int:
        """Enqueue one job; with ``connection=`` it commits or rolls back with that transaction.

        With ``key``, while a job of this task with that key is queued or running, its id is
        returned and nothing is written (docs/producers.md).
        """
        job, connection = self._one(task, tenant, options, "enqueue")
        job_id = self.sink.put(iter((NewJobColumns.of([job]),)), connection=connection,
                               trace=None)[0]
        self.observer.on_enqueue(job.queue, job.tenant, 1)
        return job_id

    async def enqueue_async(self, task: str, *, tenant: str,
                            **options: Unpack[EnqueueOptions]) -> int:
        """``enqueue`` for asyncio: ``connection=`` is a psycopg ``AsyncConnection``, a
        SQLAlchemy ``AsyncConnection`` or ``AsyncSession``, whose transaction the job joins."""
        job, connection = self._one(task, tenant, options, "enqueue_async")
        job_id = (await self.sink.put_async(NewJobColumns.of([job]), connection=connection,
                                            trace=None))[0]
        self.observer.on_enqueue(job.queue, job.tenant, 1)
        return job_id

    def enqueue_many(self, task: str, items: Iterable[Item],
                     **options: Unpack[ManyOptions]) -> list[int]:
        """Enqueue ``(tenant, payload)`` pairs, or ``(tenant, payload, key)`` triples (a key as
        in ``enqueue``): one statement per chunk of 5,000, all validated before anything is
        committed (with ``connection``, before anything is written)."""
        check_options(dict(options), MANY_OPTIONS, "enqueue_many")
        chunks = new_job_chunks(self.tasks, task, items, size=CHUNK,
                                run_at=options.get("run_at"), delay=options.get("delay"),
                                priority=options.get("priority"), cost=options.get("cost"),
                                queue=options.get("queue"))
        sent: list[NewJobColumns] = []

        def made() -> Iterator[NewJobColumns]:  # each chunk, counted once all are in
            for jobs in chunks:
                sent.append(jobs)
                yield jobs

        ids = self.sink.put(made(), connection=options.get("connection"), trace=None)
        for jobs in sent:
            self._count(jobs)
        return ids

    async def enqueue_many_async(self, task: str, items: Iterable[Item],
                                 **options: Unpack[ManyOptions]) -> list[int]:
        """``enqueue_many`` for asyncio (``connection=`` as in ``enqueue_async``)."""
        check_options(dict(options), MANY_OPTIONS, "enqueue_many_async")
        jobs = new_jobs(self.tasks, task, items, run_at=options.get("run_at"),
                        delay=options.get("delay"), priority=options.get("priority"),
                        cost=options.get("cost"), queue=options.get("queue"))
        if not jobs:
            return []
        ids = await self.sink.put_async(jobs, connection=options.get("connection"), trace=None)
        self._count(jobs)
        return ids

    def _one(self, task: str, tenant: str, options: EnqueueOptions,
             call: str) -> tuple[NewJob, Any]:
        """``enqueue``'s job, every option checked, and the caller's connection (or None)."""
        check_options(dict(options), ENQUEUE_OPTIONS, call)
        job = new_job(self.tasks, task, tenant, options.get("payload"),
                      run_at=options.get("run_at"), delay=options.get("delay"),
                      priority=options.get("priority"), cost=options.get("cost"),
                      queue=options.get("queue"), max_attempts=options.get("max_attempts"),
                      lease=options.get("lease"), key=options.get("key"))
        return job, options.get("connection")

    def _count(self, jobs: NewJobColumns) -> None:
        for t, count in Counter(jobs.tenants).items():
            self.observer.on_enqueue(jobs.queues[0], t, count)

    # -- jobs ----------------------------------------------------------------------------
    def job(self, job_id: int) -> JobInfo | None:
        """A job's status, attempts, last_error, tenant and timestamps (None if unknown)."""
        return self.store.get_job(v.integer("job id", job_id, 1, 2**63 - 1))

    def cancel(self, job_id: int) -> bool:
        """Cancel a queued job; False if it is running, finished or unknown."""
        return self.store.cancel(v.integer("job id", job_id, 1, 2**63 - 1))

    def queue_depth(self, queue: str | None = None, tenant: str | None = None) -> QueueDepth:
        """Jobs by status in one queue and/or for one tenant (None: all): queued (due and
        delayed), running, and the finished ones still kept."""
        return queue_depth(self.store, queue, tenant)

    # -- operators -----------------------------------------------------------------------
    def jobs(self, *, status: str | None = None, tenant: str | None = None,
             task: str | None = None, queue: str | None = None,
             limit: int = 100) -> list[JobInfo]:
        """Jobs matching every filter given, newest first, at most ``limit``."""
        from fairq.admin import ops

        return ops.jobs(self.store, status=status, tenant=tenant, task=task, queue=queue,
                        limit=limit)

    def retry(self, *ids: int, failed: bool = False, tenant: str | None = None,
              limit: int = 1000) -> Retried:
        """Queue failed (or cancelled) jobs again, due now, attempts reset: the ``ids`` given,
        or with ``failed=True`` up to ``limit`` failed jobs (of ``tenant``). Each job that can
        be is retried; returns the ids retried (a list), with ``.not_retried`` saying for
        each other job why not (unknown, not failed or cancelled, its key held again)."""
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
        return Worker(stores, with_hooks(self.tasks, self.attempt_hooks), settings,
                      periodics=self.periodics)
