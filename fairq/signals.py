"""SIGTERM and SIGINT turned into a call on a thread of their own.

A Python signal handler runs on the main thread between two bytecodes, possibly while that
thread holds a lock: an Event's internal one (in ``clear()``, or the first lines of
``wait()``), a pool's. A handler that takes the same lock, as ``Event.set()`` does, deadlocks
the process for good. The handler here takes none: it writes the signal number to a pipe, and a
relay thread makes the call. A repeated signal raises ``SystemExit`` from the handler itself,
which needs no lock either, for an operator who wants out now.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Sequence
from types import FrameType, TracebackType
from typing import Any

log = logging.getLogger("fairq.signals")

DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SignalRelay:
    """While entered (on the main thread only; elsewhere it does nothing), the first signal
    calls ``on_signal(signum)`` on the relay thread, and a later one exits at once.

    ``exit_if`` makes even the first signal exit at once when it returns True (the worker's:
    already stopping). It runs inside the handler, so it must take no lock: ``Event.is_set``
    is fine.
    """

    def __init__(self, on_signal: Callable[[int], None], *,
                 exit_if: Callable[[], bool] | None = None,
                 signals: Sequence[int] = DEFAULT_SIGNALS) -> None:
        self.on_signal = on_signal
        self.exit_if = exit_if
        self.signals = tuple(signals)
        self.received = 0  # signals the handler saw; written by the handler alone
        self.exited = False  # the handler raised SystemExit
        self._write_end: int | None = None
        self._thread: threading.Thread | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> SignalRelay:
        if threading.current_thread() is not threading.main_thread():
            return self  # signal.signal() works on the main thread only
        read_end, self._write_end = os.pipe()
        os.set_blocking(self._write_end, False)
        self._thread = threading.Thread(target=self._relay, args=(read_end,),
                                        name="fairq-signals", daemon=True)
        self._thread.start()
        for sig in self.signals:
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._handler)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        if self._write_end is not None:
            os.close(self._write_end)  # the relay thread reads EOF and ends
            self._write_end = None
        if self._thread is not None:
            self._thread.join(1.0)  # it may be inside on_signal: never wait long for it
            self._thread = None

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.received += 1
        if self.received > 1 or (self.exit_if is not None and self.exit_if()):
            self.exited = True
            raise SystemExit(128 + signum)
        if self._write_end is not None:
            try:
                os.write(self._write_end, bytes((signum,)))
            except OSError:  # one byte into an empty pipe cannot fail; exit if it does
                self.exited = True
                raise SystemExit(128 + signum) from None

    def _relay(self, read_end: int) -> None:
        try:
            while data := os.read(read_end, 1):
                try:
                    self.on_signal(data[0])
                except Exception:  # a failing callback must not end the relay
                    log.exception("handling signal %d failed", data[0])
        finally:
            os.close(read_end)
