"""Health checks served on /healthz and /readyz: the database answers (``db_check``), and
several checks at once (``all_of``)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable


def db_check(dsn: str, timeout: float = 2.0, cache_seconds: float = 1.0) -> Callable[[], bool]:
    """A health check that connects and runs ``SELECT 1``; cached briefly so scrapes stay cheap."""
    from fairq.store.monitor import ping  # the driver loads when a check is made, not on import

    state: dict[str, float | bool] = {"at": -math.inf, "ok": False}
    lock = threading.Lock()

    def check() -> bool:
        with lock:
            now = time.monotonic()
            if now - float(state["at"]) < cache_seconds:
                return bool(state["ok"])
            try:
                ping(dsn, timeout)
                ok = True
            except Exception:
                ok = False
            state.update(at=time.monotonic(), ok=ok)
            return ok

    return check


def all_of(*checks: Callable[[], bool]) -> Callable[[], bool]:
    """Healthy when every check is."""
    return lambda: all(c() for c in checks)
