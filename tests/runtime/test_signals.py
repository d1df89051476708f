"""A worker's signal handler takes no lock: it runs on the main thread between two bytecodes,
possibly while that thread holds the very lock ``stop()`` needs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.paths import REPO, SUPPORT

CHILD = SUPPORT / "signal_proc.py"


def test_signal_under_held_locks_stops_the_worker_and_a_second_exits(dsn: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.Popen([sys.executable, str(CHILD), dsn], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO))
    try:
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        pytest.fail(f"the child hung (a handler blocked on a lock?)\n{out}\n{err}")
    assert p.returncode == 0, err
    assert out.splitlines() == [
        "restored True relays-left 0",
        "handled-under-locks 1",
        "stopped True",
        "second-signal-exit 143 True",
        "other-thread-stopped True True",
        "other-thread-exit 143 True True",
    ], (out, err)
