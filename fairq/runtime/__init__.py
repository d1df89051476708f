"""The worker runtime, one job per module:

- ``loop``: the ``Worker`` and its claim loop (the control thread);
- ``slots``: sync and async handler slots, executing a job;
- ``finisher``: batched finishes, stuck tenants split out, replay after a lost connection;
- ``heartbeats``: lease extensions on their own thread and connection;
- ``registry``: the worker's row in the worker registry (which queues live workers serve);
- ``drain``: the graceful stop and the end of ``run(until_empty=True)``;
- ``settings``: the worker's checked options, the factory of its connections, its pools;
- ``state``: what the threads share, and the small types they pass;
- ``maintenance``: the services every worker runs (reaper, wakers, rebase, pruner, vacuum,
  periodic scheduler), one worker per interval doing each;
- ``periodic``: periodic schedules (the cron maths, ``fairq periodic list``);
- ``listener``: LISTEN/NOTIFY wake-ups on a thread of their own;
- ``signals``: SIGTERM and SIGINT relayed to a thread of their own;
- ``failure_log``: one rate-limited WARNING line per handler failure.

It never imports the app, the metrics or the CLI (the layers contract in ``.importlinter``):
``App.worker`` hands it the pieces.
"""

from fairq.runtime.loop import Worker
from fairq.runtime.settings import (
    DEFAULT_MAX_BATCH,
    MAX_CONCURRENCY,
    MAX_SECONDS,
    StoreFactory,
    WorkerSettings,
)
from fairq.runtime.slots import Slots, TaskHandler
from fairq.runtime.state import WorkerStats, describe_error

__all__ = ["DEFAULT_MAX_BATCH", "MAX_CONCURRENCY", "MAX_SECONDS", "Slots", "StoreFactory",
           "TaskHandler", "Worker", "WorkerSettings", "WorkerStats", "describe_error"]
