"""What a Store does to each new connection's server process: the allocator warm-up.

A server process whose glibc thresholds were never raised hands a statement's freed memory back
to the kernel and faults it in again on the next statement (at one busy tenant, 9,000-12,000
page faults per 1,000 jobs under the fair policies; benchmarks/RESULTS.md). The Store's
connections make one large allocation first. Read from /proc, so only where the server process
is on this machine and readable (the test's own PostgreSQL in CI).
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from fairq.store import Store

MB_STATEMENT = "SELECT length(repeat('x', 1000000))"


def _faults(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def _faults_of_repeats(conn: psycopg.Connection[object], pid: int) -> int:
    """Page faults of five statements that each allocate and free 1 MB (after a first one)."""
    conn.execute(MB_STATEMENT).fetchone()
    before = _faults(pid)
    for _ in range(5):
        conn.execute(MB_STATEMENT).fetchone()
    return _faults(pid) - before


def test_store_connections_keep_freed_memory_in_the_server_process(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as plain:
        pid = plain.info.backend_pid
        if not Path(f"/proc/{pid}/stat").exists():
            pytest.skip("the server process is not on this machine")
        cold = _faults_of_repeats(plain, pid)
    if cold < 500:
        pytest.skip(f"this server's allocator keeps freed memory anyway ({cold} faults)")
    store = Store(dsn, "fairq", min_size=1, max_size=1)
    try:
        with store.pool.connection() as conn:
            warm = _faults_of_repeats(conn, conn.info.backend_pid)
    finally:
        store.close()
    # A process that was never warmed faulted the 1 MB in again every time (~250 per statement).
    assert warm < 100, (warm, cold)
