"""SIGTERM and SIGINT turned into a call on a thread of their own.

A Python signal handler runs on the main thread between two bytecodes, possibly while that
thread holds a lock: an Event's internal one (in ``clear()``, or the first lines of
``wait()``), a pool's. A handler that takes the same lock, as ``Event.set()`` does, deadlocks
the process for good. So the handler here takes none, and the work is done by a relay thread.

The relay does not learn of a signal from the Python handler either: the kernel may deliver a
process's signal to any of its threads, and when it is not the main thread, nothing interrupts
the main thread's wait (an ``Event.wait(60)`` sleeps on), so the Python handler runs only when
that wait ends, and two signals by then are one. The relay reads the interpreter's wakeup fd
(``signal.set_wakeup_fd``), written by the C-level handler on whichever thread the signal
lands, at once and once per signal. A repeated signal, for an operator who wants out now, makes
the relay send the signal to the main thread itself (``pthread_kill``), which interrupts its
wait; the Python handler there raises ``SystemExit``, which needs no lock.
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
    already stopping). The relay thread calls it, and ``on_signal``, which must return quickly:
    a second signal is acted on once the relay has read it.
    """

    def __init__(self, on_signal: Callable[[int], None], *,
                 exit_if: Callable[[], bool] | None = None,
                 signals: Sequence[int] = DEFAULT_SIGNALS) -> None:
        self.on_signal = on_signal
        self.exit_if = exit_if
        self.signals = tuple(signals)
        self.received = 0  # signals the relay saw; written by the relay alone
        self.exited = False  # the handler raised SystemExit
        self._exit_with: int | None = None  # set by the relay: the main thread is to exit
        self._write_end: int | None = None
        self._previous_wakeup = -1
        self._thread: threading.Thread | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> SignalRelay:
        if threading.current_thread() is not threading.main_thread():
            return self  # signal.signal() and set_wakeup_fd() work on the main thread only
        read_end, self._write_end = os.pipe()
        os.set_blocking(self._write_end, False)
        self._thread = threading.Thread(target=self._relay, args=(read_end,),
                                        name="fairq-signals", daemon=True)
        self._thread.start()
        self._previous_wakeup = signal.set_wakeup_fd(self._write_end, warn_on_full_buffer=False)
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
            signal.set_wakeup_fd(self._previous_wakeup)  # before the fd's number can be reused
            os.close(self._write_end)  # the relay thread reads EOF and ends
            self._write_end = None
        if self._thread is not None:
            self._thread.join(1.0)  # it may be inside on_signal: never wait long for it
            self._thread = None

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        """On the main thread; the relay has seen the signal (or will) and decides."""
        if self._exit_with is not None:
            self.exited = True
            raise SystemExit(128 + self._exit_with)

    def _relay(self, read_end: int) -> None:
        main = threading.main_thread().ident
        try:
            while data := os.read(read_end, 64):
                for signum in data:
                    if signum not in self.signals or self._exit_with is not None:
                        continue  # another handler's signal, or our own pthread_kill's
                    self.received += 1
                    if self.received > 1 or (self.exit_if is not None and self.exit_if()):
                        self._exit_with = signum
                        if main is not None:
                            signal.pthread_kill(main, signum)
                        continue
                    try:
                        self.on_signal(signum)
                    except Exception:  # a failing callback must not end the relay
                        log.exception("handling signal %d failed", signum)
        finally:
            os.close(read_end)
