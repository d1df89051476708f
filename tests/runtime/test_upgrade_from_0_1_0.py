"""Migration 0002 applied under a running 0.1.0 worker and producer, then a new worker and
producer beside the old ones: every job done exactly once, never two runs of one job at a time,
no job without its schedule row, and caps set by the new code in the engine. The 0.1.0 code is
taken from git (its release commit), run with PYTHONPATH at it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tarfile
import time
from io import BytesIO
from pathlib import Path

import psycopg
import pytest

from fairq import migrate
from tests.support.paths import REPO

RELEASE_0_1_0 = "120e5c0"  # the commit 0.1.0 was released from
PROC = Path(__file__).resolve().parents[1] / "support" / "upgrade_proc.py"


def release_tree(tmp_path: Path) -> Path:
    """fairq and its migrations as 0.1.0 shipped them, in tmp_path/old."""
    try:
        out = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", RELEASE_0_1_0,
                              "fairq", "alembic"], capture_output=True, timeout=60, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"0.1.0's code is not in this checkout's git history ({exc})")
    old = tmp_path / "old"
    with tarfile.open(fileobj=BytesIO(out.stdout)) as tar:
        tar.extractall(old, filter="data")
    return old


def env_for(code: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(code) if code else "", str(REPO)) if p)
    return env


def start(kind: str, code: Path | None, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(PROC), kind, *args], env=env_for(code),
                            cwd=code or REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def ready(p: subprocess.Popen[str]) -> None:
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line.strip() == "READY", (line, p.stderr.read() if p.stderr else "")


def q(dsn: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql).fetchall()


def test_0002_under_a_running_0_1_0_worker_and_producer(empty_dsn: str, tmp_path: Path) -> None:
    dsn = empty_dsn
    old = release_tree(tmp_path)
    check = subprocess.run([sys.executable, "-c", "import fairq; print(fairq.__file__)"],
                           env=env_for(old), cwd=old, capture_output=True, text=True, timeout=60)
    assert check.stdout.strip().startswith(str(old)), check
    subprocess.run([sys.executable, "-m", "fairq", "--dsn", dsn, "migrate"], env=env_for(old),
                   cwd=old, check=True, capture_output=True, timeout=120)
    assert migrate.current(dsn, "fairq") == "0001"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.upgrade_runs (job_id bigint, attempt int, who text, "
                     "started timestamptz, ended timestamptz)")
    procs: list[subprocess.Popen[str]] = []
    try:
        old_worker = start("worker", old, dsn, "old")
        procs.append(old_worker)
        ready(old_worker)
        old_producer = start("produce", old, dsn, "o", "8")
        procs.append(old_producer)
        time.sleep(2)  # jobs flowing through the 0.1.0 worker
        before = q(dsn, "SELECT count(*) FROM public.upgrade_runs")[0][0]
        migrate.upgrade(dsn, "fairq")  # 0002 and on to the head, under them
        assert migrate.current(dsn, "fairq") == migrate.head()
        new_worker = start("worker", None, dsn, "new")
        procs.append(new_worker)
        ready(new_worker)
        new_producer = start("produce", None, dsn, "n", "4", "--set-caps")
        procs.append(new_producer)
        produced = 0
        for p in (old_producer, new_producer):
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            produced += int(out.strip().splitlines()[-1])
        deadline = time.monotonic() + 90
        while q(dsn, "SELECT count(*) FROM fairq.jobs WHERE status IN ('queued', 'running')"
                )[0][0]:
            assert time.monotonic() < deadline, "the workers did not drain the queue"
            for w in (old_worker, new_worker):
                assert w.poll() is None, w.stderr.read() if w.stderr else ""
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    assert before > 0
    statuses = dict(q(dsn, "SELECT status, count(*) FROM fairq.jobs GROUP BY 1"))
    assert statuses == {"done": produced}, statuses
    runs = q(dsn, "SELECT job_id, count(*) FROM public.upgrade_runs GROUP BY 1 HAVING count(*) > 1")
    assert runs == []  # each job ran exactly once
    assert q(dsn, "SELECT count(DISTINCT job_id) FROM public.upgrade_runs")[0][0] == produced
    after = dict(q(dsn, "SELECT who, count(*) FROM public.upgrade_runs r JOIN fairq.jobs j "
                        "ON j.id = r.job_id WHERE r.started > (SELECT min(started) FROM "
                        "public.upgrade_runs WHERE who = 'new') GROUP BY 1"))
    assert after.get("old", 0) > 0 and after.get("new", 0) > 0, after  # both ran jobs after it
    # Caps the new code set reached the engine.
    mismatched = q(dsn, "SELECT s.tenant FROM fairq.tenant_schedule s JOIN fairq.tenants t "
                        "USING (tenant) WHERE s.max_running <> t.max_running")
    assert mismatched == []
    assert q(dsn, "SELECT count(*) FROM fairq.tenants")[0][0] > 0
