"""Enqueue in SQL: ``<schema>.enqueue(...)`` from psql and from Node.js, the same checks and the
same NOTIFY as the Python API (which calls ``enqueue_many`` itself), and idempotency keys under
many concurrent producers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.conninfo import conninfo_to_dict

import fairq
from fairq import validation as v
from tests.support.fairtools import sql_rows
from tests.support.paths import REPO

NODE_DIR = REPO / "tests" / "node"


def enqueue_sql(dsn: str, **args: Any) -> int:
    """``SELECT fairq.enqueue(name => %(name)s, ...)`` with these named arguments."""
    named = ", ".join(f"{k} => %({k})s" for k in args)
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(f"SELECT fairq.enqueue({named})", args).fetchone()
    assert row is not None
    return int(row[0])


def refusal(dsn: str, **args: Any) -> str | None:
    """The SQL enqueue's FQ001 message for these arguments, or None if it accepted them."""
    try:
        enqueue_sql(dsn, **args)
    except psycopg.Error as exc:
        assert exc.sqlstate == "FQ001", exc
        return exc.diag.message_primary
    return None


def count_jobs(dsn: str) -> int:
    return int(sql_rows(dsn, "SELECT count(*) FROM fairq.jobs")[0][0])


def test_psql_enqueues_with_named_arguments_and_reads_a_clear_refusal(dsn: str) -> None:
    psql = shutil.which("psql")
    if psql is None:
        pytest.skip("psql is not installed")
    ok = subprocess.run(
        [psql, dsn, "-XAtqv", "ON_ERROR_STOP=1", "-c",
         "SELECT fairq.enqueue(task => 'send_report', tenant => 'acme', "
         "payload => '{\"report\": 7}'::jsonb, queue => 'reports', priority => 3)"],
        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    job_id = int(ok.stdout.strip())
    assert sql_rows(dsn, "SELECT task, tenant, payload, queue, priority, status FROM fairq.jobs "
                         "WHERE id = %s", (job_id,)) == \
        [("send_report", "acme", {"report": 7}, "reports", 3, "queued")]
    bad = subprocess.run(
        [psql, dsn, "-XAtqv", "ON_ERROR_STOP=1", "-c",
         "SELECT fairq.enqueue(task => 'send_report', tenant => '', payload => '{}')"],
        capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0
    assert "fairq: tenant must be 1 to 200 characters, not ''" in bad.stderr
    assert count_jobs(dsn) == 1


def test_node_client_enqueues_through_the_sql_function(dsn: str) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (Node.js 18+ runs tests/node/enqueue.mjs)")
    if not (NODE_DIR / "node_modules" / "pg").is_dir():
        pytest.skip("tests/node has no node_modules: npm ci --prefix tests/node")
    params = conninfo_to_dict(dsn)
    env = {**os.environ, "PGHOST": str(params.get("host", "127.0.0.1")),
           "PGPORT": str(params.get("port", 5432)), "PGUSER": str(params.get("user", "postgres")),
           "PGDATABASE": str(params["dbname"]), "PGPASSWORD": str(params.get("password", ""))}
    done = subprocess.run([node, str(NODE_DIR / "enqueue.mjs")], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout)
    rows = sql_rows(dsn, "SELECT id, task, tenant, payload, key FROM fairq.jobs ORDER BY id")
    assert rows == [(out["id"], "send_report", "acme", {"report": 7}, None),
                    (out["keyed"], "send_report", "globex", {"report": 8}, "invoice-42")]
    assert out["again"] == out["keyed"]
    assert out["refused"] == {"code": "FQ001",
                              "message": "fairq: cost must be > 0 and <= 1e9, not 0"}


def test_sql_enqueue_notifies_at_commit_like_python(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN fairq_fairq")
        with psycopg.connect(dsn) as producer:
            producer.execute("SELECT fairq.enqueue(task => 't', tenant => 'a', queue => 'q1')")
            assert list(listener.notifies(timeout=0.2, stop_after=1)) == []  # not before commit
            producer.commit()
        got = [n.payload for n in listener.notifies(timeout=10, stop_after=1)]
        assert got == ["q1"]
        with fairq.App(dsn) as app:
            app.enqueue("t", tenant="a", queue="q2")
        assert [n.payload for n in listener.notifies(timeout=10, stop_after=1)] == ["q2"]


def test_a_new_and_an_idle_tenant_start_at_the_queue_virtual_time(dsn: str) -> None:
    sql_rows(dsn, "INSERT INTO fairq.tenant_schedule (queue, tenant, vtime, active) VALUES "
                  "('default', 'busy', 7.5, true), ('default', 'idle', 1.0, false)")
    enqueue_sql(dsn, task="t", tenant="new")
    enqueue_sql(dsn, task="t", tenant="idle")
    rows = sql_rows(dsn, "SELECT tenant, vtime, active FROM fairq.tenant_schedule ORDER BY 1")
    assert rows == [("busy", 7.5, True), ("idle", 7.5, True), ("new", 7.5, True)]


def test_delayed_sql_job_leaves_its_new_tenant_asleep_until_run_at(dsn: str) -> None:
    enqueue_sql(dsn, task="t", tenant="later", run_at="2999-01-01T00:00:00Z")
    assert sql_rows(dsn, "SELECT active, wake_at IS NOT NULL FROM fairq.tenant_schedule") == \
        [(False, True)]


RUN_AT_RANGE = "run_at must be between 1970-01-01 and 9999-01-01 UTC"
BAD_SQL = [
    ({"tenant": ""}, "tenant must be 1 to 200 characters, not ''"),
    ({"tenant": None}, "tenant must be 1 to 200 characters, not null"),
    ({"task": "x" * 201}, "task must be 1 to 200 characters"),
    ({"queue": ""}, "queue must be 1 to 200 characters"),
    ({"key": ""}, "key must be 1 to 200 characters"),
    ({"priority": 40000}, "priority must be between -32768 and 32767, not 40000"),
    ({"cost": float("nan")}, "cost must be > 0 and <= 1e9, not NaN"),
    ({"cost": 2e9}, "cost must be > 0 and <= 1e9"),
    ({"max_attempts": 0}, "max_attempts must be between 1 and 1000, not 0"),
    ({"lease_seconds": 0}, "lease_seconds must be between 1 and 86400, not 0"),
    ({"run_at": "infinity"}, RUN_AT_RANGE),
    ({"run_at": "-infinity"}, RUN_AT_RANGE),
    ({"run_at": "0044-03-15 BC"}, RUN_AT_RANGE),
    ({"run_at": "1969-12-31 23:59:59.999999+00"}, RUN_AT_RANGE),
    ({"run_at": "9999-01-01 00:00:00+00"}, RUN_AT_RANGE),
    ({"payload": psycopg.types.json.Jsonb(json.loads("[" * 101 + "]" * 101))},
     "payload is nested more than 100 levels deep"),
    ({"payload": psycopg.types.json.Jsonb("x" * v.MAX_PAYLOAD_BYTES)},
     "payload is 1048578 bytes as JSON text; the limit is 1048576"),
]


@pytest.mark.parametrize(("args", "message"), BAD_SQL, ids=[m for _, m in BAD_SQL])
def test_sql_enqueue_refuses_bad_input_with_one_clear_line(dsn: str, args: dict[str, Any],
                                                           message: str) -> None:
    got = refusal(dsn, **{"task": "t", "tenant": "a", **args})
    assert got is not None and got.startswith("fairq: " + message), got
    assert "\n" not in got
    assert count_jobs(dsn) == 0
    assert sql_rows(dsn, "SELECT count(*) FROM fairq.tenant_schedule") == [(0,)]


def test_payload_limits_are_inclusive(dsn: str) -> None:
    deepest = json.loads("[" * v.MAX_PAYLOAD_DEPTH + "1" + "]" * v.MAX_PAYLOAD_DEPTH)
    enqueue_sql(dsn, task="t", tenant="a", payload=psycopg.types.json.Jsonb(deepest))
    biggest = "x" * (v.MAX_PAYLOAD_BYTES - 2)  # and its two quotes
    enqueue_sql(dsn, task="t", tenant="a", payload=psycopg.types.json.Jsonb(biggest))
    # Measured compact, as Python writes it: jsonb::text's spaces after , and : do not count.
    # 50 members of 20 characters, ',"k00":"..."' each, and a last string to fill up to the limit.
    members = {f"k{i:02}": "y" * 20 for i in range(50)}
    fill = v.MAX_PAYLOAD_BYTES - len(json.dumps({**members, "z": ""}, separators=(",", ":")))
    at_limit = {**members, "z": 'q"\\' + "z" * (fill - 5)}  # escapes count as written
    assert len(json.dumps(at_limit, separators=(",", ":"))) == v.MAX_PAYLOAD_BYTES
    enqueue_sql(dsn, task="t", tenant="a", payload=psycopg.types.json.Jsonb(at_limit))
    with fairq.App(dsn) as app:
        app.enqueue("t", tenant="a", payload=at_limit)
    over = {**at_limit, "z": at_limit["z"] + "z"}
    assert refusal(dsn, task="t", tenant="a", payload=psycopg.types.json.Jsonb(over)) == \
        f"fairq: payload is {v.MAX_PAYLOAD_BYTES + 1} bytes as JSON text; the limit is 1048576"
    assert count_jobs(dsn) == 4


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(priority=st.integers(-40000, 40000), cost=st.floats(allow_nan=True, allow_infinity=True),
       max_attempts=st.integers(-5, 1005), lease=st.integers(-5, 700000),
       tenant=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                      max_size=205))
def test_python_and_sql_accept_the_same_options(dsn: str, priority: int, cost: float,
                                                max_attempts: int, lease: int, tenant: str) -> None:
    python_ok = True
    try:
        v.priority(priority), v.cost(cost), v.max_attempts(max_attempts), v.lease(lease)
        v.name("tenant", tenant)
    except fairq.InvalidInput:
        python_ok = False
    sql_ok = refusal(dsn, task="t", tenant=tenant, priority=priority, cost=cost,
                     max_attempts=max_attempts, lease_seconds=lease) is None
    assert python_ok == sql_ok, (priority, cost, max_attempts, lease, tenant)


def test_python_refusals_from_the_sql_checks_are_invalid_input(dsn: str) -> None:
    with fairq.App(dsn) as app, pytest.raises(fairq.InvalidInput, match="nested"):
        app.enqueue("t", tenant="a", payload=json.loads("[" * 150 + "]" * 150))
    assert count_jobs(dsn) == 0


# -- idempotency keys ----------------------------------------------------------------------


def test_a_key_returns_the_live_job_and_writes_nothing(dsn: str) -> None:
    with fairq.App(dsn) as app:
        first = app.enqueue("send", tenant="acme", payload={"n": 1}, key="invoice-42")
        schedule = sql_rows(dsn, "SELECT * FROM fairq.tenant_schedule")
        xmin = sql_rows(dsn, "SELECT xmin::text FROM fairq.jobs WHERE id = %s", (first,))
        assert app.enqueue("send", tenant="acme", payload={"n": 2}, key="invoice-42") == first
        assert enqueue_sql(dsn, task="send", tenant="acme", key="invoice-42") == first
        many = app.enqueue_many("send", [("acme", {}, "invoice-42"), ("acme", {}, "k2"),
                                          ("b", {}), ("acme", {}, "k2")])
        assert many[0] == first and many[1] == many[3] and len(set(many)) == 3
        assert sql_rows(dsn, "SELECT xmin::text FROM fairq.jobs WHERE id = %s", (first,)) == xmin
        assert sql_rows(dsn, "SELECT * FROM fairq.tenant_schedule WHERE tenant = 'acme'") == \
            [r for r in schedule if r[1] == "acme"]
        # Another task with the same key is another job.
        assert app.enqueue("bill", tenant="acme", key="invoice-42") != first
    rows = sql_rows(dsn, "SELECT task, key, count(*) FROM fairq.jobs WHERE key IS NOT NULL "
                         "GROUP BY 1, 2 ORDER BY 1, 2")
    assert rows == [("bill", "invoice-42", 1), ("send", "invoice-42", 1), ("send", "k2", 1)]
    assert sql_rows(dsn, "SELECT payload FROM fairq.jobs WHERE id = %s", (first,)) == [({"n": 1},)]


def test_keys_belong_to_a_tenant_in_python_sql_and_the_cli(dsn: str) -> None:
    """Another tenant's key is not this tenant's: tenant B enqueuing with tenant A's key gets a
    job of its own (and A's job is left as it was), each tenant's repeat gets its own job."""
    import contextlib
    import io

    from fairq.cli import main

    with fairq.App(dsn) as app:
        a = app.enqueue("send", tenant="acme", payload={"n": 1}, key="invoice-42")
        b = app.enqueue("send", tenant="globex", payload={"n": 2}, key="invoice-42")
        assert b != a
        assert app.enqueue("send", tenant="globex", key="invoice-42") == b
        assert app.enqueue("send", tenant="acme", key="invoice-42") == a
        many = app.enqueue_many("send", [("acme", {}, "invoice-42"), ("initech", {}, "invoice-42"),
                                          ("globex", {}, "invoice-42")])
        assert many[0] == a and many[2] == b and many[1] not in (a, b)
    assert enqueue_sql(dsn, task="send", tenant="hooli", key="invoice-42") not in (a, b, *many)
    assert enqueue_sql(dsn, task="send", tenant="acme", key="invoice-42") == a

    def cli(tenant: str) -> tuple[int, str]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            code = main(["--dsn", dsn, "enqueue", "send", "--no-app", "--tenant", tenant,
                         "--key", "invoice-42"])
        return code, out.getvalue().strip()

    assert cli("acme") == (0, str(a))
    code, umbrella = cli("umbrella")
    assert code == 0 and int(umbrella) not in (a, b, *many)
    assert sql_rows(dsn, "SELECT tenant, payload FROM fairq.jobs WHERE id IN (%s, %s) "
                         "ORDER BY id", (a, b)) == [("acme", {"n": 1}), ("globex", {"n": 2})]
    assert sql_rows(dsn, "SELECT count(DISTINCT tenant), count(*) FROM fairq.jobs") == [(5, 5)]


def test_a_retry_delay_never_pushes_run_at_out_of_range(dsn: str) -> None:
    """A failure's retry delay is capped like an enqueue's delay (ten years): the finish stores
    it, where an uncapped one would break jobs_run_at_check and fail the whole batch."""
    from fairq.policies import get_policy
    from fairq.store import Store

    enqueue_sql(dsn, task="t", tenant="a")
    enqueue_sql(dsn, task="t", tenant="b")
    store = Store(dsn, "fairq", min_size=1, max_size=1)
    try:
        jobs = store.claim(get_policy("fifo"), queue="default", batch=2, worker="w")
        assert len(jobs) == 2
        store.finish_failed([(jobs[0].id, jobs[0].attempts, "later", 1e12),
                             (jobs[1].id, jobs[1].attempts, "soon", None)])
    finally:
        store.close()
    rows = sql_rows(dsn, "SELECT status, run_at < now() + interval '3651 days', "
                         "run_at > now() + interval '3649 days' FROM fairq.jobs ORDER BY id")
    assert rows == [("queued", True, True), ("queued", True, False)]


# Arrays of the wrong shape: a 2-D array's cardinality counts every element, but tasks[1] and
# unnest read it as flat, so each slipped past the checks in its own way.
BAD_SHAPES = [
    ({"keys": "{{k1}}"}, "keys must be a one-dimensional array, not 2-dimensional"),
    ({"queues": "{{q}}"}, "queues must be a one-dimensional array, not 2-dimensional"),
    ({"tenants": "{a,b}", "keys": "{{k1},{k2}}"},
     "keys must be a one-dimensional array, not 2-dimensional"),
    ({"tasks": "{{t3}}"}, "tasks must be a one-dimensional array, not 2-dimensional"),
    ({"tenants": "{{a}}"}, "tenants must be a one-dimensional array, not 2-dimensional"),
    ({"payloads": "{{\"{}\"}}"}, "payloads must be a one-dimensional array, not 2-dimensional"),
    ({"run_ats": "{{2030-01-01}}"}, "run_ats must be a one-dimensional array, not 2-dimensional"),
    ({"keys": "[0:0]={k1}"}, "keys must be subscripted from 1, not from 0"),
    ({"tasks": "[2:2]={t}"}, "tasks must be subscripted from 1, not from 2"),
]


@pytest.mark.parametrize(("args", "message"), BAD_SHAPES, ids=[str(a) for a, _ in BAD_SHAPES])
def test_enqueue_many_refuses_arrays_of_the_wrong_shape(dsn: str, args: dict[str, str],
                                                         message: str) -> None:
    types = {"tasks": "text[]", "tenants": "text[]", "keys": "text[]", "queues": "text[]",
             "payloads": "jsonb[]", "run_ats": "timestamptz[]"}
    args = {"tasks": "{t}", "tenants": "{a}", **args}
    named = ", ".join(f"{k} => %({k})s::{types[k]}" for k in args)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET statement_timeout = '10s'")
        with pytest.raises(psycopg.Error) as info:
            conn.execute(f"SELECT fairq.enqueue_many({named})", args)
    assert info.value.sqlstate == "FQ001", info.value
    assert info.value.diag.message_primary == "fairq: " + message
    assert count_jobs(dsn) == 0


def test_run_at_at_the_ends_of_the_range(dsn: str) -> None:
    """Inclusive at 1970-01-01 UTC, exclusive at 9999-01-01 UTC; the table refuses the rest
    whoever writes it (jobs_run_at_check), and Python gets the SQL's refusal as InvalidInput."""
    import datetime as dt

    first = enqueue_sql(dsn, task="t", tenant="a", run_at="1970-01-01 00:00:00+00")
    last = enqueue_sql(dsn, task="t", tenant="a", run_at="9998-12-31 23:59:59.999999+00")
    with pytest.raises(psycopg.errors.CheckViolation):
        sql_rows(dsn, "UPDATE fairq.jobs SET run_at = '0044-03-15 BC' WHERE id = %s", (first,))
    with pytest.raises(psycopg.errors.CheckViolation):
        sql_rows(dsn, "UPDATE fairq.jobs SET run_at = 'infinity' WHERE id = %s", (last,))
    with fairq.App(dsn) as app:
        early = dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=5)))
        with pytest.raises(fairq.InvalidInput, match=RUN_AT_RANGE):
            app.enqueue("t", tenant="a", run_at=early)
    assert count_jobs(dsn) == 2


def test_enqueue_many_maps_each_item_to_its_job(dsn: str) -> None:
    with fairq.App(dsn) as app:
        live = app.enqueue("t", tenant="x", key="live")
        ids = app.enqueue_many("t", [("a", {"i": 0}), ("b", {"i": 1}, "k"), ("x", {"i": 2}, "live"),
                                     ("d", {"i": 3}), ("b", {"i": 4}, "k"), ("f", {"i": 5})])
    assert ids[2] == live and ids[1] == ids[4]
    assert len(set(ids)) == 5
    got = dict(sql_rows(dsn, "SELECT id, payload->>'i' FROM fairq.jobs WHERE id <> %s", (live,)))
    assert got == {ids[0]: "0", ids[1]: "1", ids[3]: "3", ids[5]: "5"}


def test_a_finished_job_key_can_be_used_again(dsn: str) -> None:
    with fairq.App(dsn) as app:
        first = app.enqueue("t", tenant="a", key="nightly-2026-11-30")
        app.task(name="t")(lambda job: None)
        app.worker(concurrency=1, poll_interval=0.1).run(until_empty=True)
        assert app.job(first).status == "done"  # type: ignore[union-attr]
        second = app.enqueue("t", tenant="a", key="nightly-2026-11-30")
        assert second != first
        assert app.enqueue("t", tenant="a", key="nightly-2026-11-30") == second
        assert app.cancel(second)
        assert app.enqueue("t", tenant="a", key="nightly-2026-11-30") not in (first, second)


def test_keys_hold_under_many_concurrent_producers(dsn: str) -> None:
    """16 connections, four per tenant, enqueue the same 20 keys at once, each in its own
    transaction that commits after a pause: exactly one job per tenant and key, and every
    producer got its tenant's job's id."""
    producers, keys = 16, [f"order-{i}" for i in range(20)]

    def tenant(n: int) -> str:
        return f"t{n % 4}"

    barrier = threading.Barrier(producers)
    results: list[list[int]] = [[] for _ in range(producers)]
    errors: list[BaseException] = []

    def produce(n: int) -> None:
        try:
            with psycopg.connect(dsn) as conn:
                barrier.wait(timeout=30)
                for key in keys[n % 3:] + keys[:n % 3]:  # different orders: no lock-step
                    row = conn.execute("SELECT fairq.enqueue(task => 'pay', tenant => %s, "
                                       "key => %s)", (tenant(n), key)).fetchone()
                    assert row is not None
                    results[n].append(int(row[0]))
                    conn.commit()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    rows = sql_rows(dsn, "SELECT tenant, key, id FROM fairq.jobs ORDER BY key")
    assert len(rows) == 4 * len(keys)
    by_key = {(t, k): i for t, k, i in rows}
    for n in range(producers):
        order = keys[n % 3:] + keys[:n % 3]
        assert results[n] == [by_key[(tenant(n), k)] for k in order]


# -- the Python API's smaller refusals ---------------------------------------------------------


@pytest.mark.parametrize("items", [["ab"], [("a",)], [("a", {}, "k", 1)], [{"tenant": "a"}]])
def test_enqueue_many_refuses_items_that_are_not_pairs(dsn: str, items: list[Any]) -> None:
    with fairq.App(dsn) as app:
        with pytest.raises(fairq.InvalidInput, match=r"item 0 must be a \(tenant, payload\) pair"):
            app.enqueue_many("t", items)
        with pytest.raises(fairq.InvalidInput, match="item 1 must be"):
            app.enqueue_many("t", [("ok", {}), *items])
    assert count_jobs(dsn) == 0


def test_key_must_be_a_name(dsn: str) -> None:
    with fairq.App(dsn) as app:
        for bad in ("", "k" * 201, 42):
            with pytest.raises(fairq.InvalidInput, match="key"):
                app.enqueue("t", tenant="a", key=bad)  # type: ignore[arg-type]
            with pytest.raises(fairq.InvalidInput, match="key"):
                app.enqueue_many("t", [("a", {}), ("b", {}, bad)])
    assert count_jobs(dsn) == 0


def test_a_connection_from_another_driver_says_which_url_to_use(dsn: str) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine("sqlite://")  # psycopg2 (a plain postgresql:// URL) is the same case
    try:
        message = r"not sqlite3: create the engine with a postgresql\+psycopg:// URL"
        with fairq.App(dsn) as app, engine.connect() as conn, \
                pytest.raises(fairq.InvalidInput, match=message):
            app.enqueue("t", tenant="a", connection=conn)
    finally:
        engine.dispose()
    assert count_jobs(dsn) == 0


SCRIPT = """
import fairq
app = fairq.App("postgresql://unused")

@app.task
def hello(job):
    pass

print(" ".join(app.tasks))
"""


def test_a_task_in_a_script_run_as_main_is_named_after_the_file(tmp_path: Path) -> None:
    import sys

    (tmp_path / "app1.py").write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    as_script = subprocess.run([sys.executable, "app1.py"], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=60)
    as_module = subprocess.run([sys.executable, "-c", "import app1"], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=60)
    # The worker (`fairq worker app1:app`) imports the module: the same name both ways.
    assert as_script.stdout.strip() == as_module.stdout.strip() == "app1.hello", as_script.stderr
    interactive = subprocess.run(
        [sys.executable, "-c", "import fairq\napp = fairq.App('postgresql://unused')\n"
         "def hello(job): pass\napp.task(hello)"], capture_output=True, text=True, timeout=60)
    assert interactive.returncode != 0
    assert "fairq.errors.InvalidInput: task 'hello' is defined in __main__ without a file" in \
        interactive.stderr


def test_cli_enqueue_with_a_key_prints_the_live_job(dsn: str) -> None:
    import contextlib
    import io

    from fairq.cli import main

    def enqueue(*extra: str) -> tuple[int, str]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            code = main(["--dsn", dsn, "enqueue", "t", "--no-app", "--tenant", "acme", *extra])
        return code, out.getvalue().strip()

    code, first = enqueue("--key", "invoice-42")
    assert code == 0
    assert enqueue("--key", "invoice-42", "--payload", '{"x": 1}') == (0, first)
    assert enqueue("--key", "") == (2, "")
    assert sql_rows(dsn, "SELECT id::text, key FROM fairq.jobs") == [(first, "invoice-42")]


def test_a_key_held_by_an_open_transaction_waits_for_its_outcome(dsn: str) -> None:
    """The second producer waits for the first one's transaction: a rollback frees the key (the
    second inserts its own job), a commit gives the second the first one's job."""
    for outcome in ("rollback", "commit"):
        got: list[int] = []
        with psycopg.connect(dsn) as first:
            [(first_id,)] = first.execute("SELECT fairq.enqueue(task => 't', tenant => 'a', "
                                          "key => %s)", (outcome,)).fetchall()
            second = threading.Thread(target=lambda key=outcome, out=got: out.append(
                enqueue_sql(dsn, task="t", tenant="a", key=key, payload=psycopg.types.json.Jsonb(
                    {"second": True}))))
            second.start()
            second.join(1.0)
            assert second.is_alive() and not got  # waiting on the first transaction
            first.commit() if outcome == "commit" else first.rollback()
            second.join(30)
        assert len(got) == 1
        assert (got[0] == first_id) == (outcome == "commit")
        assert sql_rows(dsn, "SELECT id, payload FROM fairq.jobs WHERE key = %s", (outcome,)) == \
            [(got[0], {"second": True} if outcome == "rollback" else {})]


def test_a_repeatable_read_producer_meeting_a_newer_keyed_job_must_retry(dsn: str) -> None:
    with psycopg.connect(dsn) as rr:
        rr.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        rr.execute("SELECT 1")  # the snapshot is taken here
        other = enqueue_sql(dsn, task="t", tenant="a", key="k")
        with pytest.raises(psycopg.errors.SerializationFailure):
            rr.execute("SELECT fairq.enqueue(task => 't', tenant => 'a', key => 'k')")
    assert sql_rows(dsn, "SELECT id FROM fairq.jobs") == [(other,)]


def test_a_duplicate_key_sends_no_notification(dsn: str) -> None:
    enqueue_sql(dsn, task="t", tenant="a", key="k")
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN fairq_fairq")
        enqueue_sql(dsn, task="t", tenant="a", key="k")
        assert list(listener.notifies(timeout=0.5, stop_after=1)) == []
        enqueue_sql(dsn, task="t", tenant="a", key="k2")
        assert [n.payload for n in listener.notifies(timeout=10, stop_after=1)] == ["default"]


SHARED_SHAPE_CASES = [
    pytest.param({}, id="due"),
    pytest.param({"delays": [90.0]}, id="delayed"),
    pytest.param({"priorities": [3], "costs": [2.5], "max_attempts": [2], "lease_seconds": [60]},
                 id="options"),
]


@pytest.mark.parametrize("shared", SHARED_SHAPE_CASES)
def test_the_shared_shape_writes_what_the_general_path_writes(dsn: str,
                                                               shared: dict[str, Any]) -> None:
    """enqueue_many's path for App.enqueue_many's shape (no key, every column but tenants and
    payloads one element) against the general one (every column one element per job), in one
    transaction (one now()): the same jobs with ids in input order, the same tenants created,
    woken (an idle one whose wake-up is later) or left asleep, and a NOTIFY for each queue."""
    tenants = ["idle", "new", "idle", "busy", "new2", "new"]
    payloads = [json.dumps({"i": i}) for i in range(len(tenants))]
    queues = {"fast": "q_fast", "general": "q_general"}
    n = len(tenants)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN fairq_fairq")
        with psycopg.connect(dsn) as conn:
            for q in queues.values():  # the same state in both queues
                conn.execute("INSERT INTO fairq.tenant_schedule (queue, tenant, vtime, active, "
                             "wake_at) VALUES (%(q)s, 'busy', 4.0, true, NULL), "
                             "(%(q)s, 'idle', 1.0, false, now() + interval '1 hour')", {"q": q})
            ids = {}
            for path, q in queues.items():
                args = {"tasks": ["t"], "queues": [q], **shared}
                if path == "general":  # one element per job: never the shared shape
                    args = {name: value * n for name, value in args.items()}
                named = ", ".join(f"{name} => %({name})s" for name in args)
                row = conn.execute(
                    f"SELECT fairq.enqueue_many(tenants => %(tenants)s, "
                    f"payloads => %(payloads)s::jsonb[], {named})",
                    {"tenants": tenants, "payloads": payloads, **args}).fetchone()
                assert row is not None
                ids[path] = row[0]
            jobs = {path: conn.execute(
                "SELECT tenant, task, payload, status, priority, cost, run_at, attempts, "
                "max_attempts, lease_seconds, key FROM fairq.jobs WHERE id = ANY(%s) ORDER BY id",
                (ids[path],)).fetchall() for path in queues}
            schedule = {path: conn.execute(
                "SELECT tenant, weight, max_running, running, vtime, active, wake_at "
                "FROM fairq.tenant_schedule WHERE queue = %s ORDER BY tenant",
                (q,)).fetchall() for path, q in queues.items()}
            conn.commit()
        wait = 0.5 if "delays" in shared else 10  # a delayed job notifies nobody
        notified = {x.payload for x in listener.notifies(timeout=wait, stop_after=2)}
    for path in queues:
        assert len(ids[path]) == n and ids[path] == sorted(ids[path]), path
        assert [(p["i"], t) for t, _, p, *_ in jobs[path]] == list(enumerate(tenants)), path
    assert jobs["fast"] == jobs["general"]
    assert schedule["fast"] == schedule["general"]
    by_tenant = {t: (active, wake_at) for t, *_, active, wake_at in schedule["fast"]}
    assert set(by_tenant) == {"busy", "idle", "new", "new2"}
    if "delays" in shared:  # asleep until the first job is due; idle's wake-up brought forward
        assert not any(active for active, _ in by_tenant.values() if _ is not None)
        assert by_tenant["idle"][1] == by_tenant["new"][1] == jobs["fast"][0][6]
        assert notified == set()
    else:
        assert all(active for active, _ in by_tenant.values())
        assert notified == set(queues.values())
