"""The fail-over scenario's pieces: ``fairq worker`` and ``fairq exporter``
processes on the multi-host URL, their events (tests/support/failover_app.py), and the
comparison of what the clients saw succeed with what the new primary holds."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from tests.support.fault_tools import Producer
from tests.support.paths import REPO

APP = "tests.support.failover_app:app"


def spawn(args: list[str], url: str, log_dir: Path, name: str) -> subprocess.Popen[bytes]:
    """``python -m fairq ARGS`` on ``url`` (cwd: the repository, so the test app imports); its
    output goes to ``log_dir/name.log``."""
    env = {**os.environ, "FAIRQ_DATABASE_URL": url, "FAIRQ_FAILOVER_LOG": str(log_dir)}
    with (log_dir / f"{name}.log").open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "fairq", *args], cwd=REPO, env=env,
                                stdout=out, stderr=subprocess.STDOUT)


def stop(p: subprocess.Popen[bytes], timeout: float = 60.0) -> int:
    """SIGTERM (in-flight jobs finish), then SIGKILL after ``timeout``; the exit code."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
    try:
        return p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        return p.wait(10)


def scrape(port: int) -> str:
    with (contextlib.suppress(OSError),
          urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r):
        return str(r.read().decode())
    return ""


@dataclass(frozen=True)
class Event:
    kind: str  # start, end, done, lost
    n: int
    id: int
    attempt: int
    started: datetime  # the claim's started_at
    ns: int  # time.monotonic_ns() in the worker

    @property
    def claim(self) -> tuple[int, int, int, datetime]:
        return (self.n, self.id, self.attempt, self.started)


def events(log_dir: Path) -> list[Event]:
    found = []
    for f in log_dir.glob("*.events"):
        for line in f.read_text().splitlines():
            kind, n, job_id, attempt, started, ns = line.split()
            found.append(Event(kind, int(n), int(job_id), int(attempt),
                               datetime.fromisoformat(started), int(ns)))
    return found


@dataclass
class Outcome:
    """What the clients saw succeed against what the new primary holds."""

    acked: int = 0                     # enqueues the producer saw succeed
    unknown: int = 0                   # enqueues that raised
    unknown_present: int = 0           # ...of which the new primary has the job
    missing: list[int] = field(default_factory=list)       # acked, not on the new primary
    missing_in_promotion: int = 0      # ...acked from the promotion's start to the kill
    duplicated: list[int] = field(default_factory=list)    # n with more than one job
    reissued_ids: int = 0              # acked ids that name another job on the new primary
    finishes_seen: int = 0             # finishes the workers saw commit
    finishes_lost: list[int] = field(default_factory=list)  # seen commit, job ran again
    finishes_of_missing: int = 0       # seen commit, for a job the new primary never had
    runs: int = 0                      # handler executions
    reruns: int = 0                    # executions beyond one per job
    claims_unseen: int = 0             # attempts on the new primary that no handler ran
    overlaps_all: list[int] = field(default_factory=list)   # n run twice at once, any claims
    overlaps_new: list[int] = field(default_factory=list)   # ... both claimed after the kill
    not_done: list[tuple[int, str]] = field(default_factory=list)
    window: float = 0.0                # seconds from the promotion's start to the kill
    finishes_refused: int = 0          # finishes the fence refused (lease lost)

    def line(self, mode: str) -> str:
        return (f"FAILOVER {mode}: enqueues seen {self.acked}, raised {self.unknown} (present "
                f"{self.unknown_present}), seen but missing {len(self.missing)} "
                f"({self.missing_in_promotion} in the {self.window:.2f}s from the promotion's "
                f"start to the kill), ids reissued "
                f"{self.reissued_ids}; finishes seen {self.finishes_seen}, lost (job ran again) "
                f"{len(self.finishes_lost)}, of missing jobs {self.finishes_of_missing}, refused "
                f"by the fence {self.finishes_refused}; runs "
                f"{self.runs} ({self.reruns} again), claims no worker got {self.claims_unseen}, "
                f"twice at once {len(self.overlaps_all)} "
                f"(both claimed on the new primary: {len(self.overlaps_new)})")


def compare(url: str, producer: Producer, seen: list[Event], promoting_at: float,
            killed_at: float) -> Outcome:
    """The new primary's jobs (by the producer's number) against what clients saw."""
    with psycopg.connect(url, autocommit=True) as c:
        rows = c.execute("SELECT (payload->>'n')::int, id, status, attempts, started_at "
                         "FROM fairq.jobs WHERE task = 'work' AND (payload->>'n')::int >= 0"
                         ).fetchall()
    by_n: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    by_id = {}
    for r in rows:
        by_n[r[0]].append(r)
        by_id[r[1]] = r[0]
    out = Outcome(acked=len(producer.acked), unknown=len(producer.unknown))
    out.unknown_present = sum(1 for n in producer.unknown if n in by_n)
    out.missing = sorted(n for n in producer.acked if n not in by_n)
    out.missing_in_promotion = sum(1 for n in out.missing
                                   if producer.acked_at[n] >= promoting_at)
    out.window = killed_at - promoting_at
    out.duplicated = sorted(n for n, rs in by_n.items() if len(rs) > 1)
    out.reissued_ids = sum(1 for n, i in producer.acked.items() if by_id.get(i, n) != n)
    out.not_done = sorted((n, rs[0][2]) for n, rs in by_n.items() if rs[0][2] != "done")
    done = [e for e in seen if e.kind == "done"]
    out.finishes_seen = len(done)
    out.finishes_refused = sum(1 for e in seen if e.kind == "lost")
    for e in done:
        if e.n not in by_n:
            out.finishes_of_missing += 1
        elif (by_n[e.n][0][3], by_n[e.n][0][4]) != (e.attempt, e.started):
            out.finishes_lost.append(e.n)  # the job's last claim is another one: it ran again
    starts = {e.claim: e.ns for e in seen if e.kind == "start"}
    ends = {e.claim: e.ns for e in seen if e.kind == "end"}
    runs: dict[int, list[tuple[int, int, datetime]]] = defaultdict(list)
    for claim, began in starts.items():
        runs[claim[0]].append((began, ends.get(claim, 2 ** 63), claim[3]))
    out.runs = sum(len(r) for r in runs.values())
    ran = {(c[0], c[1], c[2]) for c in starts}  # (n, id, attempt) a handler began
    out.claims_unseen = sum(  # claims on the new primary whose worker never got the answer
        sum(1 for a in range(1, rs[0][3] + 1) if (n, rs[0][1], a) not in ran)
        for n, rs in by_n.items())
    out.reruns = out.runs - len(runs)
    after = datetime.fromtimestamp(killed_at).astimezone()
    for n, rs in runs.items():
        pairs = [(a, b) for i, a in enumerate(rs) for b in rs[i + 1:]
                 if a[0] < b[1] and b[0] < a[1]]  # each began before the other returned
        if pairs:
            out.overlaps_all.append(n)
        if any(a[2] > after and b[2] > after for a, b in pairs):
            out.overlaps_new.append(n)
    return out


def wait_for(pred: Any, timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(psycopg.OperationalError):
            if pred():
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def pending(url: str) -> int:
    """Jobs of ``work`` not yet done or failed on the server ``url`` reaches."""
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as c:
        row = c.execute("SELECT count(*) FROM fairq.jobs WHERE task = 'work' "
                        "AND status IN ('queued', 'running')").fetchone()
    return int(row[0]) if row else -1
