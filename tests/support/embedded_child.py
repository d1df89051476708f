"""Child process for tests/system/test_embedded.py: use the embedded server, report what it sees.

Usage: embedded_child.py HOME [hold]. Prints one JSON line; with ``hold`` it then keeps its
connection open and sleeps, so the test can ``kill -9`` a process that is using the server.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import psycopg

from fairq.embedded import ensure_server


def main() -> None:
    home = Path(sys.argv[1])
    hold = sys.argv[2:] == ["hold"]
    dsn = ensure_server(home)
    conn = psycopg.connect(dsn, autocommit=True)
    row = conn.execute(
        "select pg_postmaster_start_time()::text, current_setting('data_directory'), version()"
    ).fetchone()
    assert row is not None
    pid_file = home / "embedded" / "pgdata" / "postmaster.pid"
    print(json.dumps({
        "dsn": dsn,
        "postmaster_pid": int(pid_file.read_text().split()[0]),
        "start_time": row[0],
        "data_directory": row[1],
        "version": row[2],
    }), flush=True)
    if hold:
        time.sleep(600)
    conn.close()


if __name__ == "__main__":
    main()
