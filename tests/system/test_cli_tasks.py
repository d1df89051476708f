"""``fairq enqueue`` loads the app that registers the task: the job gets the task's queue, lease
and attempts, explicit flags override them, and a task the app does not know is refused."""

from __future__ import annotations

import secrets
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from fairq.cli import main

TASKS = '''
import fairq

app = fairq.App()

@app.task(queue="reports", max_attempts=3, lease=45, priority=2, cost=1.5)
def send_report(job):
    return None

@app.task(name="nightly", queue="batch")
def nightly(job):
    return None
'''


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dsn: str) -> Iterator[str]:
    """A module defining an app, importable from the current folder (as for `fairq worker`)."""
    monkeypatch.setenv("FAIRQ_DATABASE_URL", dsn)  # --dsn goes there too; undone afterwards
    name = f"tasks_{secrets.token_hex(4)}"
    (tmp_path / f"{name}.py").write_text(TASKS)
    monkeypatch.chdir(tmp_path)
    yield name
    sys.modules.pop(name, None)
    if str(tmp_path) in sys.path:
        sys.path.remove(str(tmp_path))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def job_row(dsn: str, job_id: int) -> tuple[str, str, int, int, int, float]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT task, queue, max_attempts, lease_seconds, priority, cost "
                           "FROM fairq.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return row  # type: ignore[return-value]


def jobs(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM fairq.jobs").fetchone()
    assert row is not None
    return int(row[0])


def test_the_job_gets_the_tasks_registration(capsys: pytest.CaptureFixture[str], dsn: str,
                                             module: str) -> None:
    code, out, err = run(capsys, "--dsn", dsn, "enqueue", f"{module}.send_report",
                         "--tenant", "acme", "--payload", '{"report": 7}')
    assert code == 0, err
    assert job_row(dsn, int(out)) == (f"{module}.send_report", "reports", 3, 45, 2, 1.5)


def test_explicit_flags_override_the_registration(capsys: pytest.CaptureFixture[str], dsn: str,
                                                  module: str) -> None:
    code, out, err = run(capsys, "--dsn", dsn, "enqueue", f"{module}.send_report",
                         "--tenant", "acme", "--queue", "urgent", "--max-attempts", "9",
                         "--lease", "600", "--priority", "-1", "--cost", "4")
    assert code == 0, err
    assert job_row(dsn, int(out)) == (f"{module}.send_report", "urgent", 9, 600, -1, 4.0)


def test_app_option_finds_a_task_named_without_its_module(
        capsys: pytest.CaptureFixture[str], dsn: str, module: str) -> None:
    code, out, err = run(capsys, "--dsn", dsn, "enqueue", "nightly", "--app", f"{module}:app",
                         "--tenant", "acme")
    assert code == 0, err
    assert job_row(dsn, int(out))[:2] == ("nightly", "batch")


@pytest.mark.parametrize("argv, said", [
    (["{m}.send_reprot"], "unknown task"),                 # misspelt: the app does not know it
    (["nightly"], "--app"),                                # no module to look in
    (["no_such_module_here.send_report"], "--app"),        # a module that is not there
    (["nightly2", "--app", "{m}:app"], "unknown task"),
    (["nightly", "--app", "{m}:nope"], "no attribute"),
    (["nightly", "--app", "{m}:app", "--no-app"], "not allowed"),
])
def test_a_task_the_app_does_not_know_exits_2_and_writes_nothing(
        capsys: pytest.CaptureFixture[str], dsn: str, module: str, argv: list[str],
        said: str) -> None:
    args = [a.format(m=module) for a in argv]
    code, out, err = run(capsys, "--dsn", dsn, "enqueue", *args, "--tenant", "acme")
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], err
    assert jobs(dsn) == 0


def test_a_misspelt_task_names_the_registered_ones(capsys: pytest.CaptureFixture[str], dsn: str,
                                                   module: str) -> None:
    code, _, err = run(capsys, "--dsn", dsn, "enqueue", f"{module}.send_reprot", "--tenant", "a")
    assert code == 2
    assert f"{module}.send_report" in err and "nightly" in err


def test_no_app_enqueues_by_name_with_the_defaults(capsys: pytest.CaptureFixture[str],
                                                   dsn: str) -> None:
    code, out, err = run(capsys, "--dsn", dsn, "enqueue", "anything.at_all", "--no-app",
                         "--tenant", "acme")
    assert code == 0, err
    assert job_row(dsn, int(out)) == ("anything.at_all", "default", 5, 300, 0, 1.0)
