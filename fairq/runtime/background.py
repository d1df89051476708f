"""A worker's background thread (the finisher, the heartbeats): started once, stopped by setting
its exit event and its wake event, so a thread asleep on either returns at once."""

from __future__ import annotations

import threading
from collections.abc import Callable


class Background:
    """One daemon thread running ``loop``; ``exit`` is set when it should return."""

    def __init__(self, name: str, loop: Callable[[], None], wake: threading.Event) -> None:
        self.name = name
        self._loop = loop
        self._wake = wake
        self._thread: threading.Thread | None = None
        self.exit = threading.Event()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the loop to return and wait for it (at most ``timeout``: a daemon thread stuck in
        a statement must not hold up the worker's exit)."""
        if self._thread is not None:
            self.exit.set()
            self._wake.set()
            self._thread.join(timeout=timeout)
            self._thread = None
