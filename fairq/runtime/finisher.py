"""The finisher: writes completed jobs in batches on its own connection, so a finish overlaps
the next claim instead of delaying it. A batch that meets a tenant row another transaction
holds is split so that only that tenant waits; after a lost connection the recent finishes are
written again (fenced), since a crash of the database may have undone them."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable

from fairq.observe import WorkerObserver
from fairq.runtime.background import Background
from fairq.runtime.db_errors import observe, react
from fairq.runtime.outage import OUTAGE_KINDS
from fairq.runtime.state import Completion, Shared, log
from fairq.store import Store
from fairq.store.errors import DatabaseError, LockNotAvailable, OperationalError, PoolTimeout

# Finishes commit without waiting for the WAL flush (see WorkerStores.finish). PostgreSQL
# flushes such commits within 3 x wal_writer_delay (600 ms by default); after a lost connection
# the worker writes the finishes of this many seconds again (fenced, so a no-op where they
# survived), so a crash of the database re-runs almost none of them.
FINISH_REPLAY_SECONDS = 10.0
REPLAY_CHUNK = 5000  # finishes per statement when they are written again


class Finisher:
    """The finisher thread and the finishing itself (the graceful stop finishes with it too)."""

    def __init__(self, shared: Shared, store: Callable[[], Store], observer: WorkerObserver, *,
                 durable: bool, max_backoff: float) -> None:
        self.shared = shared
        self._store = store
        self.observer = observer
        self.durable = durable
        self.max_backoff = max_backoff
        self._background = Background("fairq-finisher", self._loop, shared.finish_wake)
        self._exit = self._background.exit
        self._stuck: set[tuple[str, str]] = set()  # (queue, tenant) whose row another tx holds
        self._recent: deque[tuple[float, list[Completion]]] = deque()
        self.replay_wanted = threading.Event()  # set after a lost connection

    def start(self) -> None:
        self._background.start()

    def stop(self) -> None:
        self._background.stop()

    def _loop(self) -> None:
        """Write completions as they come, until the threads shut down.

        The graceful-stop path may finish on the control thread too: each call takes its own
        completions under the lock, and finishes are fenced, so the two never write one twice.
        """
        store = self._store()
        wake = self.shared.finish_wake
        failures = 0
        while not self._exit.is_set():
            wake.wait()
            wake.clear()
            try:
                if self.replay_wanted.is_set():
                    self._replay(store)
                if self.finish_completions(store):
                    self.shared.outage.ok()
                failures = 0
            except (DatabaseError, PoolTimeout) as e:
                self.lost_connection(e)
                failures += 1
                self.shared.count_db_error()  # the control thread counts its errors there too
                r = react(e, failures, self.max_backoff, "writing the finishes again")
                observe(self.observer, r.kind)
                if r.kind in OUTAGE_KINDS:
                    self.shared.outage.lost(e, r.delay)  # one line per outage (outage.py)
                elif r.unexpected:
                    log.exception("finishing jobs: %s", r.line)
                else:
                    log.warning("finishing jobs: %s", r.line)
                if r.drop_connections:
                    with contextlib.suppress(Exception):  # the server may still be away
                        store.drop_dead_connections()
                wake.set()
                self._exit.wait(r.delay)
            except Exception:  # a bug (ours or an observer's) must not stop finishing
                log.exception("finisher error; retrying in 1s")
                wake.set()
                self._exit.wait(1.0)

    def lost_connection(self, error: Exception | None) -> None:
        """If ``error`` says the connection or the server went away (None: a pool found an idle
        connection ended), the database may have crashed, undoing recent finishes it had not
        flushed: have them written again. (Lock and statement timeouts, or SQL errors, leave
        the server up and say nothing of the kind.)"""
        if self.durable:
            return
        state = getattr(error, "sqlstate", None)
        if error is None or isinstance(error, PoolTimeout) or (
                isinstance(error, OperationalError)
                and (state is None or state.startswith(("08", "57P")))):
            self.replay_wanted.set()
            self.shared.finish_wake.set()

    def _forget_old(self, now: float) -> None:
        """Drop remembered finishes older than FINISH_REPLAY_SECONDS (caller holds the lock)."""
        while self._recent and self._recent[0][0] < now - FINISH_REPLAY_SECONDS:
            self._recent.popleft()

    def recent(self) -> set[tuple[int, int]]:
        """(id, attempt) of the finishes remembered for a replay (the last 10 s of them)."""
        with self.shared.lock:
            return {(c.job.id, c.job.attempt) for _, batch in self._recent for c in batch}

    def _replay(self, store: Store) -> None:
        """Write the recent finishes again, fenced: only those a crash undid change anything."""
        with self.shared.lock:
            self._forget_old(time.monotonic())
            recent = [c for _, batch in self._recent for c in batch]
        self.replay_wanted.clear()
        repaired = 0
        try:
            for i in range(0, len(recent), REPLAY_CHUNK):
                chunk = recent[i:i + REPLAY_CHUNK]
                done = [c for c in chunk if c.error is None]
                failed = [c for c in chunk if c.error is not None]
                repaired += len(store.finish_done([(c.job.id, c.job.attempt) for c in done],
                                                  [c.result for c in done],
                                                  [c.note for c in done],
                                                  [c.run_seconds for c in done],
                                                  started=[c.job.started_at for c in done]))
                repaired += len(store.finish_failed([
                    (c.job.id, c.job.attempt, c.error or "", c.retry_delay) for c in failed],
                    [c.job.id for c in chunk if c.final], [c.run_seconds for c in failed],
                    started=[c.job.started_at for c in failed]))
        except BaseException:
            self.replay_wanted.set()
            raise
        if repaired:
            log.warning("wrote %d finish(es) again that the database had lost (a crash before "
                        "their commit was flushed)", repaired)

    def finish_completions(self, store: Store) -> bool:
        """Write every completion queued so far (kept for the next try if that fails); False
        when there was none."""
        sh = self.shared
        with sh.lock:
            batch, sh.completions = sh.completions, []
            taken = len(batch)
            sh.finishing += taken
        if not batch:
            return False
        try:
            self._write(store, batch)
        except BaseException:
            with sh.lock:  # not written: keep them for the next try (fenced, so idempotent)
                sh.completions[:0] = batch
            raise
        finally:
            with sh.lock:
                sh.finishing -= taken
            # After the count: a drain waiting for it to reach 0 must see it when it wakes.
            sh.wake.set()
        return True

    def _write(self, store: Store, batch: list[Completion]) -> None:
        """Finish ``batch``, taking out of it what was written; raise if anything is left.

        A finish locks its tenants' schedule rows to give their slots back. An application
        transaction that enqueued for an idle tenant holds that row until it commits (and a
        handler that leaked a transaction may hold its own job's row), and the batch's statement
        would wait for it and fail after ``lock_timeout``, with every other tenant's finishes in
        it. So a batch that meets a held row is finished tenant by tenant:
        only the held tenant's completions wait. Its tenant is remembered as stuck, finished on
        its own from then on (the others never wait for it again) until its finish goes
        through, and the leases of its waiting jobs are extended meanwhile, so that the reaper
        does not run them again.
        """
        lock = self.shared.lock
        with lock:
            stuck = set(self._stuck)
        ready = [c for c in batch if (c.job.queue, c.job.tenant) not in stuck]
        error: LockNotAvailable | None = None
        held: set[tuple[str, str]] = set()  # a tenant the batch's statement just waited for
        if ready:
            try:
                self._finish(store, ready, batch)
            except LockNotAvailable as e:
                error = e
                tenants = {(c.job.queue, c.job.tenant) for c in ready}
                if len(tenants) == 1:
                    held = tenants
        if not batch:
            return
        groups: dict[tuple[str, str], list[Completion]] = {}
        for c in batch:
            groups.setdefault((c.job.queue, c.job.tenant), []).append(c)
        for key, group in groups.items():
            if key not in held:
                try:
                    self._finish(store, group, batch)
                except LockNotAvailable as e:
                    error = e
                else:
                    with lock:
                        self._stuck.discard(key)
                    continue
            with lock:
                new = key not in self._stuck
                self._stuck.add(key)
            if new:
                log.warning("finishes of tenant %r (queue %r) wait: another transaction holds a "
                            "row they lock (its schedule row, or a job's); finishing the other "
                            "tenants' jobs meanwhile", key[1], key[0])
            # If the held row is a job's own, its lease cannot be extended either.
            with contextlib.suppress(LockNotAvailable):
                store.extend_leases([(c.job.id, c.job.attempt) for c in group],
                                    started=[c.job.started_at for c in group])
        if error is not None:
            raise error

    def _finish(self, store: Store, part: list[Completion], batch: list[Completion]) -> None:
        """Finish ``part`` of ``batch``: done jobs, then failed ones, each statement's jobs
        taken out of ``batch`` (in place) once it committed, so a retry never writes them again.
        """
        done = [c for c in part if c.error is None]
        failed = [c for c in part if c.error is not None]
        if done:
            # The measured run times go with the finish: policy time charges them.
            ok = {f.id for f in store.finish_done([(c.job.id, c.job.attempt) for c in done],
                                                  [c.result for c in done], [c.note for c in done],
                                                  [c.run_seconds for c in done],
                                                  started=[c.job.started_at for c in done])}
            self._finished(batch, {(c.job.id, c.job.attempt): (
                "done" if c.job.id in ok else "lease_lost") for c in done})
        if failed:
            rows = store.finish_failed([(c.job.id, c.job.attempt, c.error or "", c.retry_delay)
                                        for c in failed], [c.job.id for c in failed if c.final],
                                       [c.run_seconds for c in failed],
                                       started=[c.job.started_at for c in failed])
            status = {f.id: f.status for f in rows}
            self._finished(batch, {(c.job.id, c.job.attempt): (
                "lease_lost" if (s := status.get(c.job.id)) is None
                else "retry" if s == "queued" else "failed") for c in failed})

    def _finished(self, batch: list[Completion], outcomes: dict[tuple[int, int], str]) -> None:
        """Report and remember the completions of ``batch`` that ``outcomes`` names (written)."""
        sh = self.shared
        written = [c for c in batch if (c.job.id, c.job.attempt) in outcomes]
        batch[:] = [c for c in batch if (c.job.id, c.job.attempt) not in outcomes]
        for c in written:
            outcome = outcomes[(c.job.id, c.job.attempt)]
            sh.count(outcome)
            if outcome == "lease_lost":
                c.job.lease_lost = True
                log.warning("job %d attempt %d: lease lost before finishing (%s); nothing changed",
                            c.job.id, c.job.attempt, "done" if c.error is None else "failed")
            elif outcome == "failed":  # the failure itself was logged (failure_log)
                log.debug("job %d failed for good after %d attempt(s): %s", c.job.id,
                          c.job.attempt, (c.error or "").splitlines()[0])
            self.observer.on_finish(c.job.claimed, outcome, c.run_seconds)
        with sh.lock:  # their tenants' slots are free again: worth a claim
            for c in written:
                sh.unwritten.pop((c.job.id, c.job.attempt), None)
            sh.hot.update(c.job.queue for c in written)
            if not self.durable:
                now = time.monotonic()
                self._recent.append((now, written))
                self._forget_old(now)
        sh.wake.set()  # now, not after the rest of the batch (a held row may take seconds)
