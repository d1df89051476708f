"""The worker's row in the worker registry: written at start and at every beat on a thread of its
own, deleted at a clean stop, so ``fairq tenants explain`` can tell a queue no live worker
serves (``no_worker``) from one whose tenants wait their turn.

A failed write is logged and tried again at the next beat: the registry informs operators, it
never stops a worker. A worker that dies without a clean stop leaves its row; readers count it
dead once it missed ``MISSED_BEATS`` beats (``fairq.store.workers``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from fairq.runtime.background import Background
from fairq.runtime.state import log
from fairq.store import Store
from fairq.store.errors import DatabaseError, InsufficientPrivilege, PoolTimeout
from fairq.store.workers import register_worker, unregister_worker

# Seconds between two beats when the worker sets no heartbeat_interval.
DEFAULT_BEAT_SECONDS = 10.0


def _first_line(error: BaseException) -> str:
    """The error's first line: a log line stays one line (PostgreSQL adds LINE and a caret)."""
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:200]


class WorkerRegistry:
    """The registry thread of one worker; ``start`` writes the first beat before it returns."""

    def __init__(self, store: Callable[[], Store], worker_id: str, *, queues: Sequence[str],
                 policy: str, beat_seconds: float | None) -> None:
        self._store = store
        self.worker_id = worker_id
        self.queues = list(queues)
        self.policy = policy
        self.beat_seconds = beat_seconds or DEFAULT_BEAT_SECONDS
        self._wake = threading.Event()
        self._background = Background("fairq-registry", self._loop, self._wake)
        self._failing = False

    def start(self) -> None:
        self.beat()
        self._background.start()

    def stop(self) -> None:
        """Stop beating and delete the row (a failure only leaves it to be judged dead)."""
        self._background.stop()
        try:
            unregister_worker(self._store(), self.worker_id)
        except (DatabaseError, PoolTimeout) as e:
            log.warning("could not remove worker %s from the registry (%s); it counts as gone "
                        "once it missed its beats", self.worker_id, _first_line(e))

    def beat(self) -> bool:
        """Write the row now; False (logged once per run of failures) when it failed."""
        try:
            register_worker(self._store(), self.worker_id, queues=self.queues,
                            policy=self.policy, beat_seconds=self.beat_seconds)
        except (DatabaseError, PoolTimeout) as e:
            if not self._failing:
                hint = (" (grant it with `fairq roles --worker ROLE --apply`)"
                        if isinstance(e, InsufficientPrivilege) else "")
                log.warning("could not write worker %s to the registry%s: %s; trying again "
                            "every %gs", self.worker_id, hint, _first_line(e), self.beat_seconds)
            self._failing = True
            return False
        if self._failing:
            log.info("worker %s is in the registry again", self.worker_id)
        self._failing = False
        return True

    def _loop(self) -> None:
        exit_ = self._background.exit
        while not exit_.wait(self.beat_seconds):
            try:
                self.beat()
            except Exception:  # a bug must not end the beats
                log.exception("worker registry error; trying again at the next beat")
