"""Child process for tests/runtime/test_signals.py: signal handling on a real main thread.

Usage: signal_proc.py DSN. Prints one line per step; the parent checks them and the exit code.
"""

from __future__ import annotations

import signal
import sys
import threading
import time

import fairq
from fairq.runtime.signals import SignalRelay


def main() -> int:
    app = fairq.App(sys.argv[1], schema="fairq")
    app.task(name="noop")(lambda job: None)

    # 1. Worker.run() installs its handlers, and takes them and the relay thread away again.
    worker = app.worker(concurrency=1, policy="fifo", listen=False)
    worker.run(until_empty=True)
    relays = [t for t in threading.enumerate() if t.name == "fairq-signals"]
    print("restored", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,
          "relays-left", len(relays), flush=True)

    # 2. A signal that lands while the main thread holds the locks stop() takes (it was busy
    # in an Event's clear() or wait()) must neither block nor be lost.
    worker = app.worker(concurrency=1, policy="fifo", listen=False)
    with SignalRelay(lambda _: worker.stop(), exit_if=worker.shared.stopping.is_set) as relay:
        with worker.shared.stopping._cond, worker.shared.wake._cond:  # type: ignore[attr-defined]
            signal.raise_signal(signal.SIGTERM)
            deadline = time.monotonic() + 1.0
            while not relay.received and time.monotonic() < deadline:
                pass  # the handler runs here, between two bytecodes, under both locks
            print("handled-under-locks", relay.received, flush=True)
        print("stopped", worker.shared.stopping.wait(10), flush=True)
        # 3. The second signal exits at once.
        try:
            signal.raise_signal(signal.SIGTERM)
            time.sleep(1.0)
        except SystemExit as e:
            print("second-signal-exit", e.code, relay.exited, flush=True)

    # 4. Signals the kernel delivers to another thread while the main thread sleeps in a long
    # wait: the first is handled and the second exits, both at once (the Python handler alone
    # runs only when the wait ends, and sees the two as one). A sender thread sends each once the
    # main thread's innermost Python frame is threading's wait, i.e. it is blocked in the wait.
    worker = app.worker(concurrency=1, policy="fifo", listen=False)
    other = threading.Thread(target=threading.Event().wait, args=(60,), daemon=True)
    other.start()
    target, main_ident = other.ident, threading.main_thread().ident
    assert target is not None and main_ident is not None

    def main_waiting() -> bool:
        frame = sys._current_frames().get(main_ident)
        return (frame is not None and frame.f_code.co_name == "wait"
                and frame.f_code.co_filename == threading.__file__)

    about_to_wait = [threading.Event(), threading.Event()]  # set by the main thread

    def send_when_main_waits(i: int) -> None:
        about_to_wait[i].wait(30)
        deadline = time.monotonic() + 10
        while not main_waiting() and time.monotonic() < deadline:
            time.sleep(0.01)  # polling the main thread's state, which has no event to wait on
        signal.pthread_kill(target, signal.SIGTERM)

    def send_twice() -> None:
        send_when_main_waits(0)
        send_when_main_waits(1)

    exit_code = None
    started = time.monotonic()
    with SignalRelay(lambda _: worker.stop(), exit_if=worker.shared.stopping.is_set) as relay:
        threading.Thread(target=send_twice, daemon=True).start()
        try:
            about_to_wait[0].set()
            stopped = worker.shared.stopping.wait(30)
            # Each wait is 30 s: ending well before that means the signal ended it (25 s leaves
            # room for a loaded machine).
            print("other-thread-stopped", stopped, time.monotonic() - started < 25, flush=True)
            started = time.monotonic()
            about_to_wait[1].set()
            threading.Event().wait(30)
        except SystemExit as e:
            exit_code = e.code
    print("other-thread-exit", exit_code, relay.exited, time.monotonic() - started < 25,
          flush=True)
    app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
