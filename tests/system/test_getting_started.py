"""docs/getting-started.md followed word for word: its ``myapp/tasks.py`` written as printed, its
"try it" commands run as printed through the installed ``fairq`` command, and the job is done."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import psycopg

from tests.support.paths import REPO

DOC = REPO / "docs" / "getting-started.md"
FAIRQ = Path(sys.executable).parent / "fairq"  # the console script installed with this fairq


def blocks(kind: str) -> list[str]:
    """The doc's fenced code blocks of one language, in order."""
    return re.findall(rf"^```{kind}\n(.*?)^```", DOC.read_text(encoding="utf-8"), re.S | re.M)


def test_the_getting_started_example_runs_its_job(dsn: str, tmp_path: Path) -> None:
    tasks = next(b for b in blocks("python") if b.startswith("# myapp/tasks.py\n"))
    commands = next(b for b in blocks("sh") if "fairq worker" in b and "fairq enqueue" in b)
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "tasks.py").write_text(tasks, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRQ_")}
    env["FAIRQ_DATABASE_URL"] = dsn
    outputs = []
    for line in commands.strip().splitlines():
        argv = shlex.split(line, comments=True)
        assert argv[0] == "fairq", line
        proc = subprocess.run([str(FAIRQ), *argv[1:]], cwd=tmp_path, env=env, text=True,
                              capture_output=True, timeout=120)
        assert proc.returncode == 0, f"{line}: {proc.stderr}"
        outputs.append(proc.stdout)
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT id, task, queue, status FROM fairq.jobs").fetchall()
    assert rows == [(1, "myapp.tasks.send_report", "reports", "done")]
    shown = json.loads(outputs[-1])
    assert (shown["status"], shown["result"]) == ("done", {"report": 7, "sent": True})


def test_the_periodic_example_declares_and_lists_its_schedules(dsn: str, tmp_path: Path) -> None:
    python = blocks("python")
    tasks = next(b for b in python if b.startswith("# myapp/tasks.py\n"))
    more = next(b for b in python if b.startswith("# myapp/tasks.py (continued)\n"))
    listing = next(b for b in blocks("sh") if "fairq periodic list" in b)
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "tasks.py").write_text(tasks + more, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRQ_")}
    env["FAIRQ_DATABASE_URL"] = dsn
    for line in listing.strip().splitlines():
        argv = shlex.split(line, comments=True)
        proc = subprocess.run([str(FAIRQ), *argv[1:], "--json"], cwd=tmp_path, env=env,
                              text=True, capture_output=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        shown = {(s["name"], s["tenant"], s["cron"]) for s in json.loads(proc.stdout)}
        assert shown == {("myapp.tasks.nightly_report", "acme", "0 2 * * *"),
                         ("myapp.tasks.nightly_report", "globex", "0 2 * * *"),
                         ("myapp.tasks.send_report", "acme", "*/15 * * * *")}
