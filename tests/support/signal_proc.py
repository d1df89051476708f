"""Child process for tests/runtime/test_signals.py: signal handling on a real main thread.

Usage: signal_proc.py DSN. Prints one line per step; the parent checks them and the exit code.
"""

from __future__ import annotations

import signal
import sys
import threading
import time

import fairq
from fairq.signals import SignalRelay


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
    # runs only when the wait ends, and sees the two as one). A sender thread sends each after a
    # pause, so that the main thread is inside its wait by then; if the box is so slow that it is
    # not, the step passes without showing anything, it cannot fail wrongly.
    worker = app.worker(concurrency=1, policy="fifo", listen=False)
    other = threading.Thread(target=threading.Event().wait, args=(60,), daemon=True)
    other.start()
    target = other.ident
    assert target is not None

    def send_twice() -> None:
        time.sleep(0.5)
        signal.pthread_kill(target, signal.SIGTERM)
        worker.shared.stopping.wait(30)
        time.sleep(0.5)
        signal.pthread_kill(target, signal.SIGTERM)

    exit_code = None
    started = time.monotonic()
    with SignalRelay(lambda _: worker.stop(), exit_if=worker.shared.stopping.is_set) as relay:
        threading.Thread(target=send_twice, daemon=True).start()
        try:
            stopped = worker.shared.stopping.wait(30)
            print("other-thread-stopped", stopped, time.monotonic() - started < 20, flush=True)
            threading.Event().wait(30)
        except SystemExit as e:
            exit_code = e.code
    print("other-thread-exit", exit_code, relay.exited, time.monotonic() - started < 20,
          flush=True)
    app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
