"""Child process for tests/system/test_system_user.py: use, or remove and re-create, a system user.

Usage: sysuser_child.py use NAME MIN_ROUNDS DONE_FILE | churn NAME ROUNDS DONE_FILE.
Each waits for a line on stdin (so all start at once), then prints one JSON line.
``use``: at least MIN_ROUNDS times and until DONE_FILE exists, take the user (created if missing)
and run ``id`` as it through the path initdb runs through; report the ids it read and what ``id``
printed. ``churn``: ROUNDS times remove the user under the lock, then take it again (re-created);
touch DONE_FILE at the end.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fairq.embedded import sysuser
from fairq.embedded.process import run_as


def use(name: str, min_rounds: int, done: Path) -> list[dict[str, object]]:
    seen: list[dict[str, object]] = []
    while len(seen) < min_rounds or not done.exists():
        with sysuser.held(name) as user:
            ran = run_as(user, ["sh", "-c", "id -u && id -g && id -un"], timeout=60)
        seen.append({"uid": user.pw_uid, "gid": user.pw_gid, "rc": ran.returncode,
                     "id": ran.stdout.split()})
    return seen


def churn(name: str, rounds: int, done: Path) -> list[dict[str, object]]:
    seen: list[dict[str, object]] = []
    try:
        for _ in range(rounds):
            with sysuser.users_lock(exclusive=True):
                existed = sysuser.lookup(name) is not None
                sysuser.remove(name)
                gone = sysuser.lookup(name) is None
            with sysuser.held(name) as user:
                seen.append({"existed": existed, "gone": gone, "uid": user.pw_uid})
    finally:
        done.touch()
    return seen


def main() -> None:
    role, name, rounds, done = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    sys.stdin.readline()  # the start signal
    result = use(name, rounds, done) if role == "use" else churn(name, rounds, done)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
