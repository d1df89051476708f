"""Migrations: round trips, concurrency, schema names. (That the chain ends at the engine
files: test_engine_sql.py.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from typing import Any

import psycopg
import pytest
from alembic.script import ScriptDirectory

import fairq
from fairq import migrate
from fairq.schema import JOBS_STORAGE, engine_ddl
from tests.support.catalog import differences, snapshot

TABLES = {"alembic_version", "jobs", "periodic", "settings", "tenant_schedule", "tenants",
          "tenant_groups", "group_schedule", "workers", "slot_returns",
          "claim_budgets", "job_traces"}
BAD_SCHEMAS = ['a"b', "Robert'); DROP TABLE jobs; --", "UPPER", "1abc", "x" * 64, "a b", "é"]


def tables(dsn: str, schema: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
        ).fetchall()
    return {r[0] for r in rows}


def schemas(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {r[0] for r in conn.execute("SELECT nspname FROM pg_namespace").fetchall()}


def reloptions(dsn: str, schema: str, table: str) -> dict[str, str]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT c.reloptions FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s", (schema, table)
        ).fetchone()
    assert row is not None
    return dict(opt.split("=", 1) for opt in (row[0] or []))


def functions(dsn: str, schema: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT p.proname FROM pg_proc p JOIN pg_namespace n "
                            "ON n.oid = p.pronamespace WHERE n.nspname = %s", (schema,)).fetchall()
    return {r[0] for r in rows}


# Every function the migrations create: the ones the named statements and Python call, and the
# ones those call (fairq.schema.ENGINE_FILES).
FUNCTIONS = {"claim_fair", "claim_room", "claim_settle", "claim_terms", "decay_usage", "eff_weight",
             "effective_weight", "enqueue", "enqueue_many", "groups_due", "queue_vtime",
             "refresh_groups", "return_slots", "tenant_dry", "tenant_tokens", "throttled_open",
             "throttled_total", "token_at", "token_due", "wait_and_pick", "returns_lock",
             "fold_returns", "run_average", "fold_capped", "fold_stale_returns", "settle_capped",
             "tenant_running", "give_ahead", "return_budgets", "wait_reason", "lock_settings", "trace_jobs",
             "ensure_schedule", "repair_schedule", "tenants_version"}


def test_baseline_up_down_up(empty_dsn: str) -> None:
    """The baseline creates every table and function; its downgrade drops all it created
    (alembic_version stays, empty), and it can run again."""
    migrate.upgrade(empty_dsn, "fairq")
    assert tables(empty_dsn, "fairq") == TABLES
    assert functions(empty_dsn, "fairq") == FUNCTIONS
    migrate.downgrade(empty_dsn, "fairq")
    assert tables(empty_dsn, "fairq") <= {"alembic_version"}
    assert functions(empty_dsn, "fairq") == set()
    assert migrate.current(empty_dsn, "fairq") is None
    migrate.upgrade(empty_dsn, "fairq")
    assert tables(empty_dsn, "fairq") == TABLES
    assert functions(empty_dsn, "fairq") == FUNCTIONS


def test_the_claim_inlines_the_effective_weight(dsn: str) -> None:
    """effective_weight, the one definition of weight x group factor, is inlined where it is
    called in a statement: the claim's walk pays no function call per tenant."""
    with psycopg.connect(dsn) as conn:
        plan = "\n".join(r[0] for r in conn.execute(
            "EXPLAIN VERBOSE SELECT fairq.effective_weight(ts.weight, (SELECT g.factor "
            "FROM fairq.group_schedule g WHERE g.queue = ts.queue)) FROM fairq.tenant_schedule ts"
        ).fetchall())
    assert "Output: LEAST((ts.weight * COALESCE((SubPlan" in plan, plan
    assert "effective_weight" not in plan, plan


def test_the_rate_limit_functions_are_inlined(dsn: str) -> None:
    """The rate-limit sql functions (set no search_path so that they stay inlinable) are
    inlined: a statement calling them calls no function of fairq's."""
    names = ("claim_room", "tenant_tokens", "tenant_dry", "token_due", "token_at",
             "throttled_open", "throttled_total")
    with psycopg.connect(dsn) as conn:
        plan = "\n".join(r[0] for r in conn.execute(
            "EXPLAIN VERBOSE SELECT " + ", ".join(f"fairq.{n}(ts)" for n in names)
            + " FROM fairq.tenant_schedule ts").fetchall())
    assert not [n for n in names if n in plan], plan


def test_the_wait_reason_is_inlined(dsn: str) -> None:
    """wait_reason, the one definition of the reasons' order, costs the explain and the
    console's tenant list no function call per row."""
    with psycopg.connect(dsn) as conn:
        plan = "\n".join(r[0] for r in conn.execute(
            "EXPLAIN VERBOSE SELECT fairq.wait_reason(ts.running, ts.running, 1, ts.max_running, "
            "ts.active, now(), now(), ts.running, ts.active) FROM fairq.tenant_schedule ts"
        ).fetchall())
    assert "wait_reason" not in plan and "at_cap" in plan, plan


def test_upgrade_is_idempotent(empty_dsn: str) -> None:
    migrate.upgrade(empty_dsn, "fairq")
    migrate.upgrade(empty_dsn, "fairq")
    with psycopg.connect(empty_dsn) as conn:
        versions = conn.execute("SELECT version_num FROM fairq.alembic_version").fetchall()
    assert len(versions) == 1


def test_jobs_table_storage_parameters(dsn: str) -> None:
    assert reloptions(dsn, "fairq", "jobs") == JOBS_STORAGE


def test_concurrent_migrations_from_many_processes_all_succeed(empty_dsn: str) -> None:
    """Two `fairq migrate` commands and two App.migrate() callers start at the same moment."""
    code = "import sys, fairq; fairq.App(sys.argv[1]).migrate()"
    commands = [[sys.executable, "-m", "fairq", "--dsn", empty_dsn, "migrate"]] * 2 + [
        [sys.executable, "-c", code, empty_dsn]] * 2
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in commands]
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
    assert tables(empty_dsn, "fairq") == TABLES
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM fairq.alembic_version").fetchone() == (1,)


@pytest.mark.parametrize("bad", BAD_SCHEMAS)
def test_odd_schema_names_are_rejected_before_touching_the_database(
    empty_dsn: str, bad: str
) -> None:
    before = schemas(empty_dsn)
    with pytest.raises(fairq.InvalidInput):
        migrate.upgrade(empty_dsn, bad)
    with pytest.raises(fairq.InvalidInput):
        migrate.upgrade_sql(bad)
    with pytest.raises(fairq.InvalidInput):
        fairq.App(empty_dsn, schema=bad)
    assert schemas(empty_dsn) == before


def test_odd_schema_name_from_the_environment_is_rejected(
    empty_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAIRQ_SCHEMA", 'a"b')
    with pytest.raises(fairq.InvalidInput):
        fairq.App(empty_dsn)
    env = dict(os.environ, FAIRQ_SCHEMA="Robert'); DROP")
    proc = subprocess.run([sys.executable, "-m", "fairq", "--dsn", empty_dsn, "migrate"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_second_schema_lives_beside_fairq_in_one_database(dsn: str) -> None:
    migrate.upgrade(dsn, "tenant_q2")
    assert tables(dsn, "tenant_q2") == TABLES
    with psycopg.connect(dsn, autocommit=True) as conn:  # the whole engine, in its own schema
        conn.execute('CREATE SCHEMA "fq_engine"')
        for ddl in engine_ddl("fq_engine"):
            conn.execute(ddl)
        assert differences(snapshot(conn, "tenant_q2"), snapshot(conn, "fq_engine")) == []
    with fairq.App(dsn) as main, fairq.App(dsn, schema="tenant_q2") as q2:
        a = main.enqueue("t.main", tenant="acme")
        b = q2.enqueue("t.q2", tenant="globex")
        q2.tenants.set("globex", weight=5)
        info_a, info_b = main.job(a), q2.job(b)
        assert info_a is not None and info_a.task == "t.main"
        assert info_b is not None and info_b.task == "t.q2"
        assert [t.tenant for t in main.tenants.list()] == ["acme"]
        assert [t.tenant for t in q2.tenants.list()] == ["globex"]
    # Removing one queue's schema leaves the other alone.
    migrate.downgrade(dsn, "tenant_q2")
    assert tables(dsn, "tenant_q2") <= {"alembic_version"}
    assert tables(dsn, "fairq") == TABLES
    with psycopg.connect(dsn) as conn:
        assert len(snapshot(conn, "fairq")) > 150


def test_upgrade_sql_names_the_schema_and_creates_tables() -> None:
    text = migrate.upgrade_sql("tenant_q2")
    assert "CREATE TABLE tenant_q2.jobs" in text or 'CREATE TABLE "tenant_q2".jobs' in text
    assert "fillfactor" in text


# -- a worker refuses a schema its statements may not fit ------------------------------------
def _noop_app(dsn: str, schema: str = "fairq") -> fairq.App:
    app = fairq.App(dsn, schema=schema)
    app.task(name="noop")(lambda job: None)
    return app


def _refusal(app: fairq.App) -> BaseException | None:
    """What ``run(until_empty=True)`` raised; fails (instead of hanging) if the worker did not
    refuse but went on retrying its statements' errors."""
    worker = app.worker(policy="fifo", listen=False)
    raised: list[BaseException] = []

    def go() -> None:
        try:
            worker.run(until_empty=True)
        except BaseException as e:
            raised.append(e)

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    thread.join(30)
    if thread.is_alive():
        worker.stop()
        thread.join(30)
        pytest.fail("the worker did not refuse the schema within 30 s")
    return raised[0] if raised else None


def test_worker_refuses_a_schema_that_was_never_migrated(empty_dsn: str) -> None:
    app = _noop_app(empty_dsn)
    try:
        error = _refusal(app)
        assert isinstance(error, fairq.ConfigurationError), error
        assert "no fairq tables: run `fairq migrate`" in str(error)
    finally:
        app.close()


LATER = '''"""a later migration, which changes nothing"""
revision = "9000_later"
down_revision = "{head}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
'''


def test_worker_refuses_an_older_revision_and_runs_on_an_unknown_newer_one(
        empty_dsn: str, caplog: pytest.LogCaptureFixture, tmp_path: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    migrate.upgrade(empty_dsn, "fairq")
    ours = migrate.head()
    # A fairq with one migration more (a copy of the migrations folder and a no-op one after
    # this head): to it, the schema at this head is an older revision.
    later = tmp_path / "migrations"
    shutil.copytree(migrate.migrations_dir(), later,
                    ignore=shutil.ignore_patterns("__pycache__"))
    (later / "versions" / "9000_later.py").write_text(LATER.replace("{head}", ours))
    monkeypatch.setattr(migrate, "migrations_dir", lambda: later)
    app = _noop_app(empty_dsn)
    try:
        error = _refusal(app)
        assert isinstance(error, fairq.ConfigurationError), error
        head = ScriptDirectory.from_config(migrate._config(None, "fairq")).get_current_head()
        assert head == "9000_later"
        assert f"at fairq revision {ours}, this fairq needs {head}: run `fairq migrate`" in str(error)
        assert migrate.upgrade(empty_dsn, "fairq") == (ours, head)
        app.worker(policy="fifo", listen=False).run(until_empty=True)  # at head: no complaint
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            conn.execute("UPDATE fairq.alembic_version SET version_num = '9999_from_the_future'")
        app.enqueue("noop", tenant="a")
        with caplog.at_level("WARNING", logger="fairq.migrate"):
            worker = app.worker(policy="fifo", listen=False)
            worker.run(until_empty=True)
        assert worker.stats.done == 1
        assert f"9999_from_the_future, which this fairq (at {head}) does not know" in caplog.text
    finally:
        app.close()


def test_cli_worker_on_an_unmigrated_schema_is_one_line(empty_dsn: str, tmp_path: Any) -> None:
    (tmp_path / "mig_tasks.py").write_text("import fairq\napp = fairq.App()\n"
                                           "app.task(name='t')(lambda job: None)\n")
    proc = subprocess.run([sys.executable, "-m", "fairq", "--dsn", empty_dsn, "worker",
                           "mig_tasks:app", "--until-empty"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.endswith("has no fairq tables: run `fairq migrate` (or App.migrate()) "
                                "first\n"), proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.parametrize("policy", ["fifo", "round_robin", "weighted", "drr"])
def test_a_connection_that_claimed_keeps_claiming_after_a_newer_release_adds_columns(
        dsn: str, policy: str) -> None:
    """A newer release's migration adds columns under running workers. The same connection,
    with its cached plans (and a plpgsql function's cached row types), must go on claiming
    and finishing."""
    from fairq.models import NewJob
    from fairq.policies import get_policy
    from fairq.store import Store

    store = Store(dsn, "fairq", min_size=1, max_size=1)  # one connection: the cached one
    try:
        store.pool.wait()
        pol = get_policy(policy)
        store.enqueue([NewJob(task="t", tenant=t, payload_json="{}") for t in ("a", "a", "b", "b")])
        first = store.claim(pol, queue="default", batch=1, worker="w")
        assert len(first) == 1
        store.finish_done([(first[0].id, first[0].attempts)])
        with psycopg.connect(dsn, autocommit=True) as conn:
            for table in ("jobs", "tenant_schedule", "tenants"):
                conn.execute(f"ALTER TABLE fairq.{table} ADD COLUMN newer_note text DEFAULT 'x'")
        rest = store.claim(pol, queue="default", batch=8, worker="w")
        assert len(rest) == 3
        store.finish_done([(j.id, j.attempts) for j in rest])
        # A delayed job: its tenant sleeps, and the claim that finds it due reads it as a
        # sleeper (idle, its wake-up passed), however late that claim comes.
        store.enqueue([NewJob(task="t", tenant="c", payload_json="{}", delay=0.3)])
        deadline = time.monotonic() + 30
        woke: list[Any] = []
        while not woke and time.monotonic() < deadline:
            woke = store.claim(pol, queue="default", batch=8, worker="w")
            time.sleep(0.05)
        assert [j.tenant for j in woke] == ["c"]
        store.finish_done([(woke[0].id, woke[0].attempts)])
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT count(*) FROM fairq.jobs WHERE status = 'done'"
                                ).fetchone() == (5,)
    finally:
        store.close()
