"""Upgrades as an operator runs them: `fairq migrate` says what it did, `--status` says what it
would do, `--sql` is the reviewable upgrade from the database's own revision, and workers keep
running while the schema moves ahead of them (migrate first, then restart the workers)."""

from __future__ import annotations

import json
import threading
import time

import psycopg
import pytest

import fairq
from fairq import migrate
from fairq.cli import main
from fairq.policies import get_policy

HEAD = migrate._script().get_current_head()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def version(dsn: str) -> str | None:
    return migrate.current(dsn, "fairq")


def test_migrate_says_created_or_nothing_to_do(
        capsys: pytest.CaptureFixture[str], empty_dsn: str) -> None:
    code, out, _ = run(capsys, "--dsn", empty_dsn, "migrate")
    assert code == 0 and f"created fairq's tables at revision {HEAD}" in out, out
    code, out, _ = run(capsys, "--dsn", empty_dsn, "migrate")
    assert code == 0 and f"already at fairq revision {HEAD}: nothing to do" in out, out
    migrate.downgrade(empty_dsn, "fairq", "base")  # fairq's tables gone: created again
    assert version(empty_dsn) is None
    code, out, _ = run(capsys, "--dsn", empty_dsn, "migrate")
    assert code == 0 and f"created fairq's tables at revision {HEAD}" in out, out
    assert version(empty_dsn) == HEAD


def test_status_lists_the_chain_in_order(
        capsys: pytest.CaptureFixture[str], empty_dsn: str) -> None:
    script = migrate._script()
    chain = [r.revision for r in reversed(list(script.walk_revisions()))]
    assert chain[0] == "0001" and chain[-1] == HEAD
    code, out, _ = run(capsys, "--dsn", empty_dsn, "migrate", "--status", "--json")
    st = json.loads(out)
    assert st["current"] is None and st["head"] == HEAD
    assert [rev for rev, _ in st["pending"]] == chain
    assert st["pending"][0][1].startswith("baseline:")
    code, out, _ = run(capsys, "--dsn", empty_dsn, "migrate", "--status")
    assert code == 0 and "none (no fairq tables)" in out, out
    assert [line.split()[0] for line in out.splitlines() if line.startswith("  ")] == chain
    assert version(empty_dsn) is None  # --status changed nothing
    migrate.upgrade(empty_dsn, "fairq")
    code, out, _ = run(capsys, "--dsn", empty_dsn, "migrate", "--status")
    assert code == 0 and "up to date: nothing to do" in out, out


def test_sql_is_the_upgrade_from_the_current_revision_and_applies(
        capsys: pytest.CaptureFixture[str], empty_dsn: str) -> None:
    code, out, _ = run(capsys, "--dsn", empty_dsn, "migrate", "--sql")
    assert code == 0
    # from nothing, through every migration, to the head
    assert "Running upgrade  -> " in out and f" -> {HEAD}\n" in out and "CREATE TABLE fairq.jobs" in out
    assert "CREATE FUNCTION \"fairq\".claim_fair(" in out
    assert version(empty_dsn) is None  # printed, not run
    with psycopg.connect(empty_dsn, autocommit=True) as conn:  # what a DBA would run with psql
        conn.execute(out.encode())
    assert version(empty_dsn) == HEAD
    code, out, _ = run(capsys, "--dsn", empty_dsn, "migrate", "--sql")
    assert code == 0 and "nothing to upgrade" in out and "CREATE" not in out
    with fairq.App(empty_dsn) as app:  # the schema the SQL made works
        app.enqueue("t", tenant="a")
        assert len(app.store.claim(get_policy("weighted"), queue="default", batch=2,
                                   worker="w")) == 1


def test_a_revision_this_fairq_does_not_know_is_one_line(
        capsys: pytest.CaptureFixture[str], empty_dsn: str) -> None:
    """A schema at a revision this fairq does not know (a newer fairq's, or one a development
    build wrote before the baseline) is left alone, with one line saying why."""
    migrate.upgrade(empty_dsn, "fairq")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("UPDATE fairq.alembic_version SET version_num = '0020'")
    code, out, err = run(capsys, "--dsn", empty_dsn, "migrate")
    assert code == 1 and out == "", out
    assert err.count("\n") == 1 and "at fairq revision '0020', which this fairq" in err, err
    assert version(empty_dsn) == "0020"


def test_sql_from_an_unknown_revision_is_a_usage_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "migrate", "--sql", "--from", "0042")
    assert code == 2 and out == "" and "unknown fairq revision '0042'" in err


def test_a_running_worker_keeps_working_while_the_schema_moves_ahead(dsn: str) -> None:
    """The rolling-upgrade order: migrate while the old workers run, then restart them. A
    newer fairq's migration only adds (columns with defaults, indexes, functions): simulated
    here by one such change and the newer revision stamped, under a running worker."""
    app = fairq.App(dsn)
    done: list[int] = []
    app.task(name="t")(lambda job: done.append(job.id))
    worker = app.worker(policy="weighted", concurrency=2, poll_interval=0.2)
    thread = threading.Thread(target=worker.run, daemon=True)
    try:
        thread.start()
        assert worker.ready.wait(30)
        first = app.enqueue("t", tenant="a")
        # The worker's connection has run the fair claim (and PostgreSQL has cached its plans and
        # types) before the schema changes under it.
        deadline = time.monotonic() + 30
        while not done and time.monotonic() < deadline:
            time.sleep(0.05)
        assert done == [first]
        migrate.upgrade(dsn, "fairq")  # takes the migration lock under the running worker
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE fairq.jobs ADD COLUMN newer_note text DEFAULT 'x'")
            conn.execute("CREATE INDEX jobs_newer_idx ON fairq.jobs (newer_note)")
            conn.execute("UPDATE fairq.alembic_version SET version_num = '9999_newer'")
        later = [app.enqueue("t", tenant=t) for t in ("a", "b", "c")]
        deadline = time.monotonic() + 30
        while len(done) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(done) == sorted([first, *later])
    finally:
        worker.stop()
        thread.join(30)
    # ...and a restarted (older) worker starts on the newer schema too.
    again = app.enqueue("t", tenant="d")
    restarted = app.worker(policy="fifo", listen=False)
    restarted.run(until_empty=True)
    info = app.job(again)
    assert info is not None and info.status == "done"
    app.close()
