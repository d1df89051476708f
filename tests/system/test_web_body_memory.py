"""A real ``fairq web`` process sent huge bodies (declared 300 MiB, and 64 MiB chunked with
no length), with the token and without: each refused (413, or 403 before any of it is read),
and the process's peak memory (VmHWM) stays within a few MiB of what it was (reading a
300 MiB body took 600 MiB)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.paths import REPO
from tests.support.pgcluster import free_port

pytest.importorskip("uvicorn", reason="the web extra: pip install -e '.[web]'")

TOKEN = "b0dy-" + "x" * 24
CHUNK = b" " * 65536
ALLOWED_GROWTH = 24 * 2**20  # the limit is 1 MiB; the rest is allocator noise


@pytest.fixture
def server(dsn: str) -> Iterator[tuple[int, int]]:
    """``fairq web --allow-actions`` on the test database: (its PID, its port)."""
    port = free_port()
    env = {**os.environ, "FAIRQ_DATABASE_URL": dsn, "FAIRQ_WEB_TOKEN": TOKEN}
    proc = subprocess.Popen([sys.executable, "-m", "fairq", "web", "--port", str(port),
                             "--allow-actions"], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/overview", timeout=5).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield proc.pid, port
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def peak_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def post(port: int, head: str, chunks: int, chunked: bool) -> str:
    """Send the head and up to ``chunks`` 64 KiB pieces (stopping when the server closes);
    the status line it answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head.encode())
        try:
            for _ in range(chunks):
                s.sendall(b"10000\r\n" + CHUNK + b"\r\n" if chunked else CHUNK)
            if chunked:
                s.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # answered and closed before the body was all sent: what is wanted
        answer = b""
        try:
            while b"\r\n" not in answer:
                got = s.recv(4096)
                if not got:
                    break
                answer += got
        except ConnectionResetError:
            pass
    return answer.split(b"\r\n", 1)[0].decode()


def test_huge_bodies_are_refused_without_the_memory(server: tuple[int, int]) -> None:
    pid, port = server
    before = peak_bytes(pid)
    declared = (f"POST /api/tenants/acme HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {300 * 2**20}\r\n\r\n")
    assert post(port, declared, 4800, chunked=False) == "HTTP/1.1 413 Request Entity Too Large"
    # Chunked (no length): refused for who it is before any of it is read (403), or cut at
    # 1 MiB once the token lets the console read it (413).
    for auth, status in (("", "403 Forbidden"),
                         (f"Authorization: Bearer {TOKEN}\r\n", "413 Request Entity Too Large")):
        streamed = (f"POST /api/tenants/acme HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}"
                    "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        assert post(port, streamed, 1024, chunked=True) == f"HTTP/1.1 {status}"
    grown = peak_bytes(pid) - before
    assert grown < ALLOWED_GROWTH, f"peak memory grew {grown / 2**20:.1f} MiB"
    # Still serving.
    assert urllib.request.urlopen(f"http://127.0.0.1:{port}/api/overview", timeout=10).status \
        == 200
