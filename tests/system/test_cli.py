"""The ``fairq`` command: exit codes, one-line messages, no secrets, and each command's effect."""

from __future__ import annotations

import argparse
import importlib
import json
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

import fairq
from fairq.cli import COMMANDS, build_parser, main

SECRET = "s3cr3t-pw"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got: {err!r}"
    assert "Traceback" not in err
    return lines[0]


def tenants(dsn: str) -> dict[str, tuple[float, int]]:
    with fairq.App(dsn) as app:
        return {t.tenant: (t.weight, t.max_running) for t in app.tenants.list() if t.configured}


# -- the command itself ----------------------------------------------------------------------
def test_help_lists_the_commands_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for name in ("migrate", "worker", "enqueue", "job", "cancel", "prune", "tenants", "stats"):
        assert name in out


def _newest_migration() -> str:
    """The revision no migration names as its down_revision, read from the files themselves."""
    import re

    from fairq.migrate import migrations_dir

    revisions, downs = set(), set()
    for script in (migrations_dir() / "versions").glob("*.py"):
        text = script.read_text()
        revisions |= set(re.findall(r"^revision\s*=\s*[\"'](\w+)[\"']", text, re.M))
        downs |= set(re.findall(r"^down_revision\s*=\s*[\"'](\w+)[\"']", text, re.M))
    (head,) = revisions - downs
    return head


def test_python_dash_m_fairq_is_the_same_command() -> None:
    proc = subprocess.run([sys.executable, "-m", "fairq", "--version"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"fairq {fairq.__version__} (schema revision {_newest_migration()})"


def test_version_is_written_once() -> None:
    """The package's metadata (pyproject.toml) reads the version fairq.__version__ holds."""
    import tomllib
    from importlib.metadata import version

    assert fairq.__version__ == version("fairq")
    pyproject = tomllib.loads((Path(fairq.__file__).parents[1] / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"]
    assert "version" in pyproject["project"]["dynamic"]


def _commands() -> list[str]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(sub.choices)


def test_every_command_module_registers_a_working_command() -> None:
    """Each module in COMMANDS imports and adds at least one command (none 'unavailable')."""
    before: set[str] = set()
    for module in COMMANDS:
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(f"fairq.cli.{module}").register(sub, argparse.ArgumentParser(
            add_help=False))
        added = set(sub.choices)
        assert added, f"fairq.cli.{module} registered no command"
        assert not added & before, f"fairq.cli.{module} registers a command twice"
        before |= added
    assert before == set(_commands())


@pytest.mark.parametrize("command", _commands())
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: fairq {command}")
    assert "unavailable" not in out


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "frobnicate")
    assert code == 2 and out == ""
    assert "frobnicate" in one_line(err)


def test_migrate_sql_prints_sql_without_a_database(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--dsn", "postgresql://nobody@127.0.0.1:1/none", "migrate", "--sql",
                       "--from", "base")
    assert code == 0
    assert "CREATE TABLE" in out and "fairq.jobs" in out


def test_migrate_sql_honours_schema(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "migrate", "--sql", "--from", "base", "--schema", "tenant_q2")
    assert code == 0 and "tenant_q2.jobs" in out


def test_migrate_then_migrate_again(capsys: pytest.CaptureFixture[str], empty_dsn: str) -> None:
    assert run(capsys, "--dsn", empty_dsn, "migrate")[0] == 0
    code, out, _ = run(capsys, "migrate", "--dsn", empty_dsn)  # options after the command too
    assert code == 0 and "already at fairq revision" in out and "nothing to do" in out


def test_commands_on_an_unmigrated_database_say_to_migrate(
    capsys: pytest.CaptureFixture[str], empty_dsn: str
) -> None:
    code, _, err = run(capsys, "--dsn", empty_dsn, "tenants", "list")
    assert code == 1
    assert "fairq migrate" in one_line(err)


# -- jobs --------------------------------------------------------------------------------------
def test_enqueue_prints_the_id_and_job_shows_it(
    capsys: pytest.CaptureFixture[str], dsn: str
) -> None:
    code, out, _ = run(capsys, "--dsn", dsn, "enqueue", "reports.send", "--no-app", "--tenant", "acme",
                       "--payload", '{"report": 7}', "--priority", "3", "--queue", "q1",
                       "--cost", "2.5", "--delay", "60")
    assert code == 0
    job_id = int(out.strip())
    code, out, _ = run(capsys, "--dsn", dsn, "job", str(job_id))
    assert code == 0
    info = json.loads(out)
    assert info["id"] == job_id and info["status"] == "queued"
    assert (info["tenant"], info["task"], info["queue"]) == ("acme", "reports.send", "q1")
    assert info["payload"] == {"report": 7}
    assert (info["priority"], info["cost"]) == (3, 2.5)
    assert info["run_at"] > info["created_at"]


def test_unknown_job_ids_exit_2(capsys: pytest.CaptureFixture[str], dsn: str) -> None:
    code, out, err = run(capsys, "--dsn", dsn, "job", "424242")
    assert code == 2 and out == ""
    assert "424242" in one_line(err)
    code, out, err = run(capsys, "--dsn", dsn, "cancel", "424242")
    assert code == 2 and out == ""
    assert "424242" in one_line(err) and "no such job" in err


def test_cancel_a_queued_job_then_again(capsys: pytest.CaptureFixture[str], dsn: str) -> None:
    with fairq.App(dsn) as app:
        job_id = app.enqueue("t", tenant="acme")
    assert run(capsys, "--dsn", dsn, "cancel", str(job_id))[0] == 0
    code, _, err = run(capsys, "--dsn", dsn, "cancel", str(job_id))
    assert code == 1 and "cancelled" in one_line(err)
    with fairq.App(dsn) as app:
        info = app.job(job_id)
    assert info is not None and info.status == "cancelled"


def test_prune_deletes_only_old_finished_jobs(
    capsys: pytest.CaptureFixture[str], dsn: str
) -> None:
    with fairq.App(dsn) as app:
        old, new, queued = (app.enqueue("t", tenant="acme") for _ in range(3))
        app.cancel(old)
        app.cancel(new)
    with psycopg.connect(dsn) as conn:
        conn.execute("UPDATE fairq.jobs SET finished_at = now() - interval '2 hours' WHERE id = %s",
                     (old,))
    code, out, _ = run(capsys, "--dsn", dsn, "prune", "--older-than", "3600")
    assert code == 0 and "deleted 1" in out
    with fairq.App(dsn) as app:
        assert app.job(old) is None
        assert app.job(new) is not None and app.job(queued) is not None


# -- bad input: exit 2, one line, nothing written ---------------------------------------------
@pytest.mark.parametrize(
    "argv",
    [
        ["tenants", "set", "acme", "--weight", "-1"],
        ["tenants", "set", "acme", "--weight", "0"],
        ["tenants", "set", "acme", "--weight", "nan"],
        ["tenants", "set", "acme", "--weight", "inf"],
        ["tenants", "set", "acme", "--weight", "heavy"],
        ["tenants", "set", "acme", "--max-running", "-1"],
        ["tenants", "set", "acme", "--max-running", "2.5"],
        ["tenants", "set", "acme"],
        ["tenants", "set", "", "--weight", "2"],
        ["enqueue", "t", "--tenant", "acme", "--payload", "{not json"],
        ["enqueue", "t", "--tenant", "acme", "--payload", "NaN"],
        ["enqueue", "t", "--tenant", ""],
        ["enqueue", "t", "--tenant", "x" * 201],
        ["enqueue", "t"],
        ["enqueue", "t", "--tenant", "acme", "--delay", "-5"],
        ["enqueue", "t", "--tenant", "acme", "--priority", "high"],
        ["enqueue", "t", "--tenant", "acme", "--priority", "40000"],
        ["enqueue", "t", "--tenant", "acme", "--cost", "0"],
        ["worker", "somewhere:app", "--policy", "lottery"],
        ["worker", "somewhere:app", "--concurrency", "0"],
        ["worker", "somewhere:app", "--batch", "0"],
        ["worker", "somewhere:app", "--claim-ahead", "-1"],
        ["worker", "somewhere:app", "--reap-grace", "-1"],
        ["worker", "somewhere:app", "--reap-grace", "soon"],
        ["tenants", "apply", "/nonexistent/tenants.toml"],
        ["job", "abc"],
        ["job", "0"],
        ["cancel", "-3"],
        ["prune", "--older-than", "soon"],
        ["stats", "--window", "0"],
        ["--schema", "UPPER", "tenants", "list"],
        ["--schema", 'a"b', "migrate"],
        ["tenants"],
    ],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(
    capsys: pytest.CaptureFixture[str], dsn: str, argv: list[str]
) -> None:
    code, out, err = run(capsys, "--dsn", dsn, *argv)
    assert code == 2, err
    assert out == ""
    one_line(err)
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM fairq.jobs").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM fairq.tenants").fetchone() == (0,)


def test_nan_payload_is_rejected_even_though_python_json_parses_it(
    capsys: pytest.CaptureFixture[str], dsn: str
) -> None:
    code, _, err = run(capsys, "--dsn", dsn, "enqueue", "t", "--tenant", "a", "--payload", "NaN")
    assert code == 2 and "payload" in one_line(err)


# -- tenants ------------------------------------------------------------------------------------
def test_tenants_set_and_list(capsys: pytest.CaptureFixture[str], dsn: str) -> None:
    assert run(capsys, "--dsn", dsn, "tenants", "set", "acme", "--weight", "3",
               "--max-running", "20")[0] == 0
    assert run(capsys, "--dsn", dsn, "tenants", "set", "acme", "--max-running", "0")[0] == 0
    assert tenants(dsn) == {"acme": (3.0, 0)}
    code, out, _ = run(capsys, "--dsn", dsn, "tenants", "list")
    assert code == 0 and "acme" in out
    code, out, _ = run(capsys, "--dsn", dsn, "tenants", "list", "--json")
    assert [(t["tenant"], t["weight"], t["max_running"]) for t in json.loads(out)] == [
        ("acme", 3.0, 0)]


def test_tenants_apply_a_file(capsys: pytest.CaptureFixture[str], dsn: str, tmp_path: Path) -> None:
    f = tmp_path / "tenants.toml"
    f.write_text('[defaults]\nweight = 1.0\nmax_running = 5\n\n'
                 '[tenants.acme]\nweight = 3.0\nmax_running = 20\n\n[tenants.globex]\nweight = 2\n')
    code, out, _ = run(capsys, "--dsn", dsn, "tenants", "apply", str(f))
    assert code == 0 and "2 tenant" in out
    assert tenants(dsn) == {"acme": (3.0, 20), "globex": (2.0, 5)}


def test_tenants_file_without_defaults_keeps_them(
    capsys: pytest.CaptureFixture[str], dsn: str, tmp_path: Path
) -> None:
    """Unknown tenants paused with ``max_running = 0`` stay paused when a file that names one
    tenant (and no [defaults]) is applied; a field [defaults] leaves out keeps its value too."""
    pause = tmp_path / "pause.toml"
    pause.write_text("[defaults]\nweight = 2.0\nmax_running = 0\n")
    assert run(capsys, "--dsn", dsn, "tenants", "apply", str(pause))[0] == 0
    with fairq.App(dsn) as app:
        app.enqueue("t", tenant="stranger")  # its schedule row follows the defaults: paused
    one = tmp_path / "one.toml"
    one.write_text("[tenants.acme]\nweight = 3.0\n")
    assert run(capsys, "--dsn", dsn, "tenants", "apply", str(one))[0] == 0
    partial = tmp_path / "partial.toml"
    partial.write_text("[defaults]\nweight = 4.0\n")
    assert run(capsys, "--dsn", dsn, "tenants", "apply", str(partial))[0] == 0
    with fairq.App(dsn) as app:
        assert app.store.get_defaults() == (4.0, 0)
        assert app.tenants.get("acme").max_running == 0  # left out: the defaults' cap
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT weight, max_running FROM fairq.tenant_schedule "
                         "WHERE tenant = 'stranger'").fetchone() == (4.0, 0)


@pytest.mark.parametrize(
    "text",
    [
        "[tenants.acme\nweight = 3",  # not TOML
        "[tenants.acme]\nweight = 3\n[tenants.globex]\nweight = -1\n",  # one bad tenant
        "[tenants.acme]\nweight = 3\n[tenants.globex]\nspeed = 2\n",  # unknown key
        "[defaults]\nweight = 0\n[tenants.acme]\nweight = 3\n",  # bad defaults
        '[tenants.""]\nweight = 2\n',  # empty tenant name
    ],
)
def test_tenants_apply_is_all_or_nothing(
    capsys: pytest.CaptureFixture[str], dsn: str, tmp_path: Path, text: str
) -> None:
    assert run(capsys, "--dsn", dsn, "tenants", "set", "acme", "--weight", "2")[0] == 0
    f = tmp_path / "tenants.toml"
    f.write_text(text)
    code, out, err = run(capsys, "--dsn", dsn, "tenants", "apply", str(f))
    assert code == 2 and out == ""
    one_line(err)
    assert tenants(dsn) == {"acme": (2.0, 10)}


# -- secrets and unreachable databases ----------------------------------------------------------
@pytest.mark.parametrize(
    "argv",
    [
        ["--dsn", f"postgresql://u:{SECRET}@127.0.0.1:1/x", "tenants", "list"],
        ["--dsn", f"postgresql://u:{SECRET}@127.0.0.1:1/x", "migrate"],
        ["--dsn", f"postgresql://u:{SECRET}@127.0.0.1:1/x", "enqueue", "t", "--tenant", "a"],
        ["--dsn", f"postgresql://u:{SECRET}@127.0.0.1:1/x", "stats"],
        ["--dsn", f"host=127.0.0.1 port=1 user=u password={SECRET} dbname=x", "job", "1"],
        ["--dsn", f"postgresql://u:{SECRET}@127.0.0.1:1/x?sslmode=bogus", "tenants", "list"],
        ["--dsn", f"postgresql://u:{SECRET}@/x?host=127.0.0.1&port=notaport", "tenants", "list"],
    ],
)
def test_passwords_never_appear_in_messages(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    code, out, err = run(capsys, *argv)
    assert code in (1, 2)
    line = one_line(err)
    assert SECRET not in out + err
    assert line.startswith("fairq")


def test_password_from_the_environment_is_not_printed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAIRQ_DATABASE_URL", f"postgresql://u:{SECRET}@127.0.0.1:1/x")
    code, out, err = run(capsys, "tenants", "list")
    assert code == 1
    assert SECRET not in out + err
    assert "***" in one_line(err)


def test_password_is_not_printed_by_a_subprocess_even_with_debug() -> None:
    """The installed command end to end; FAIRQ_DEBUG=1 adds a traceback but still no password."""
    import os

    env = dict(os.environ, FAIRQ_DEBUG="1")
    proc = subprocess.run(
        [sys.executable, "-m", "fairq", "--dsn", f"postgresql://u:{SECRET}@127.0.0.1:1/x",
         "tenants", "list"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1
    assert SECRET not in proc.stdout + proc.stderr.splitlines()[-1]


# -- stats ----------------------------------------------------------------------------------
def test_stats_table_and_json(capsys: pytest.CaptureFixture[str], dsn: str) -> None:
    with fairq.App(dsn) as app:
        app.tenants.set("acme", weight=3)
        app.enqueue_many("t", [("acme", {})] * 6 + [("globex", {})] * 4)
        app.enqueue("t", tenant="globex", delay=3600)
        app.enqueue("t", tenant="initech", queue="other")
    with psycopg.connect(dsn) as conn:
        # 3 acme and 1 globex jobs were claimed just now; one acme job finished, one failed;
        # an old globex job was claimed long ago (outside the window).
        conn.execute("""
            UPDATE fairq.jobs SET status = 'running', started_at = now(), attempts = 1
            WHERE id IN (SELECT id FROM fairq.jobs WHERE tenant = 'acme' ORDER BY id LIMIT 3)
               OR id = (SELECT min(id) FROM fairq.jobs WHERE tenant = 'globex')""")
        conn.execute("""
            UPDATE fairq.jobs SET status = 'done', finished_at = now()
            WHERE id = (SELECT min(id) FROM fairq.jobs WHERE tenant = 'acme')""")
        conn.execute("""
            UPDATE fairq.jobs SET status = 'failed', finished_at = now()
            WHERE id = (SELECT min(id) + 1 FROM fairq.jobs WHERE tenant = 'acme')""")
        conn.execute("""
            UPDATE fairq.jobs SET status = 'done', started_at = now() - interval '1 hour',
                   finished_at = now() - interval '1 hour'
            WHERE id = (SELECT max(id) FROM fairq.jobs
                        WHERE tenant = 'globex' AND run_at <= now())""")
        conn.execute("UPDATE fairq.jobs SET run_at = now() - interval '90 seconds' "
                     "WHERE status = 'queued' AND tenant = 'acme'")

    code, out, _ = run(capsys, "--dsn", dsn, "stats", "--json", "--window", "300")
    assert code == 0
    rows = {(r["queue"], r["tenant"]): r for r in json.loads(out)["tenants"]}
    acme, globex = rows["default", "acme"], rows["default", "globex"]
    assert (acme["due"], acme["delayed"], acme["running"], acme["done"], acme["failed"]) == (
        3, 0, 1, 1, 1)
    assert (globex["due"], globex["delayed"], globex["running"], globex["done"]) == (2, 1, 1, 1)
    assert acme["max_running"] == 10 and acme["weight"] == 3.0
    assert acme["recent_claims"] == 3 and globex["recent_claims"] == 1
    assert acme["claim_share"] == pytest.approx(0.75)
    assert globex["claim_share"] == pytest.approx(0.25)
    assert acme["weight_share"] == pytest.approx(0.75)
    assert globex["weight_share"] == pytest.approx(0.25)
    assert acme["oldest_wait_seconds"] >= 89
    assert rows["other", "initech"]["weight_share"] == pytest.approx(1.0)  # per queue
    assert rows["other", "initech"]["claim_share"] is None

    code, out, _ = run(capsys, "--dsn", dsn, "stats")
    assert code == 0
    header, *lines = out.strip().splitlines()
    assert "oldest wait" in header and "running/cap" in header
    assert any("acme" in line and "75%" in line and "1/10" in line for line in lines)

    code, out, _ = run(capsys, "--dsn", dsn, "stats", "--queue", "other", "--json")
    assert [r["tenant"] for r in json.loads(out)["tenants"]] == ["initech"]


def test_stats_on_an_empty_queue(capsys: pytest.CaptureFixture[str], dsn: str) -> None:
    code, out, _ = run(capsys, "--dsn", dsn, "stats")
    assert code == 0 and "no jobs" in out
    code, out, _ = run(capsys, "--dsn", dsn, "stats", "--json")
    assert json.loads(out)["tenants"] == []


# -- worker ----------------------------------------------------------------------------------
def test_worker_target_must_name_an_app(
    capsys: pytest.CaptureFixture[str], dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "noapp_mod.py").write_text("x = 1\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    targets = ("noapp_mod", "noapp_mod:x", "noapp_mod:missing", "no_such_module_xyz:app", ":app")
    for target in targets:
        code, _, err = run(capsys, "--dsn", dsn, "worker", target)
        assert code == 2, (target, err)
        one_line(err)


def test_worker_hands_its_options_to_the_worker(
    capsys: pytest.CaptureFixture[str], dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flags reach WorkerSettings under their own names; unset ones keep its defaults."""
    (tmp_path / "opts_mod.py").write_text("import fairq\napp = fairq.App()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[dict[str, object]] = []

    class Stub:
        def run(self, until_empty: bool = False) -> None:
            seen[-1]["until_empty"] = until_empty

    def worker(self: fairq.App, **options: object) -> Stub:
        seen.append(options)
        return Stub()

    monkeypatch.setattr(fairq.App, "worker", worker)
    code, _, err = run(capsys, "--dsn", dsn, "worker", "opts_mod:app", "--reap-grace", "0.5",
                       "--grace-period", "7", "--until-empty")
    assert code == 0, err
    assert seen[0]["reap_grace"] == 0.5 and seen[0]["grace_period"] == 7.0
    assert seen[0]["until_empty"] is True
    code, _, err = run(capsys, "--dsn", dsn, "worker", "opts_mod:app", "--until-empty")
    assert code == 0, err
    assert "reap_grace" not in seen[1] and "grace_period" not in seen[1]


def test_worker_until_empty_runs_the_jobs(dsn: str, tmp_path: Path) -> None:
    (tmp_path / "cli_tasks.py").write_text(
        "import fairq\n"
        "app = fairq.App()\n"
        "@app.task(name='cli.touch')\n"
        "def touch(job):\n"
        "    pass\n"
    )
    with fairq.App(dsn) as app:
        ids = app.enqueue_many("cli.touch", [("acme", {}), ("globex", {})])
    proc = subprocess.run(
        [sys.executable, "-m", "fairq", "--dsn", dsn, "worker", "cli_tasks:app", "--until-empty",
         "--concurrency", "2", "--policy", "round_robin", "--poll-interval", "0.2",
         "--batch", "1", "--durable-finishes"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    with fairq.App(dsn) as app:
        assert [app.job(i).status for i in ids] == ["done", "done"]  # type: ignore[union-attr]


def test_worker_sigterm_finishes_the_job_and_logs_start_signal_and_stop(
        dsn: str, tmp_path: Path) -> None:
    (tmp_path / "cli_sleepy.py").write_text(
        "import time\n"
        "import fairq\n"
        "app = fairq.App()\n"
        "@app.task(name='cli.sleepy')\n"
        "def sleepy(job):\n"
        "    print('started', flush=True)\n"
        "    time.sleep(1.0)\n"
    )
    with fairq.App(dsn) as app:
        job_id = app.enqueue("cli.sleepy", tenant="acme")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fairq", "--dsn", dsn, "worker", "cli_sleepy:app",
         "--concurrency", "2"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        # The handler's line, read as it comes ('' if the worker died first): no polling.
        assert proc.stdout.readline() == "started\n", proc.stderr.read()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    with fairq.App(dsn) as app:
        info = app.job(job_id)
        assert info is not None and info.status == "done"
    # INFO by default: the start, the signal and the stop with its counts; nothing per job.
    assert "INFO fairq.worker: worker " in err and "policy=weighted concurrency=2" in err, err
    assert "signal 15: stopping" in err, err
    assert "stopped: done=1 retry=0 failed=0" in err, err
    assert len(err.splitlines()) == 3, err
