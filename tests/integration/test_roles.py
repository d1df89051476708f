"""Least privilege: on a private cluster, an owner migrates and applies
``fairq roles --apply``; then each part runs as its own role with only those grants (producers
enqueue, workers claim and finish, the monitor reads stats and metrics) and each role is shown
what it cannot do."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import fairq
from fairq.cli import main
from fairq.policies import get_policy
from fairq.store import Store
from fairq.store.workers import register_worker, unregister_worker
from tests.support.fault_tools import private_cluster, sql

ROLES = ("fq_owner", "fq_worker", "fq_producer", "fq_monitor")


def as_role(dsn: str, role: str) -> str:
    params = conninfo_to_dict(dsn)
    params["user"] = role
    return make_conninfo(**params)  # type: ignore[arg-type]


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def denied(dsn: str, statement: str) -> bool:
    try:
        sql(dsn, statement)
    except psycopg.errors.InsufficientPrivilege:
        return True
    return False


@pytest.fixture(scope="module")
def dsns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    with private_cluster(tmp_path_factory.mktemp("roles")) as holder:
        su = holder[0].dsn
        for role in ROLES:
            sql(su, f"CREATE ROLE {role} LOGIN")
        sql(su, "CREATE DATABASE app")
        params = conninfo_to_dict(su)
        params["dbname"] = "app"
        su_app = make_conninfo(**params)  # type: ignore[arg-type]
        sql(su_app, "GRANT CREATE ON DATABASE app TO fq_owner")
        sql(su_app, "GRANT pg_monitor TO fq_monitor")  # superuser's part, as docs/roles.md says
        d = {role.removeprefix("fq_"): as_role(su_app, role) for role in ROLES}
        d["superuser"] = su_app
        fairq.App(d["owner"]).migrate()
        code, _, err = cli("--dsn", d["owner"], "roles", "--apply", "--worker", "fq_worker",
                             "--producer", "fq_producer", "--monitor", "fq_monitor")
        assert code == 0, err
        yield d


def test_owner_owns_the_schema_and_superuser_was_not_needed(dsns: dict[str, str]) -> None:
    rows = sql(dsns["owner"], "SELECT tableowner FROM pg_tables WHERE schemaname = 'fairq'")
    assert rows and {r[0] for r in rows} == {"fq_owner"}
    assert sql(dsns["owner"], "SELECT rolsuper FROM pg_roles WHERE rolname = current_user") == \
        [(False,)]


def test_lifecycle_with_each_part_as_its_role(dsns: dict[str, str],
                                              caplog: pytest.LogCaptureFixture) -> None:
    with fairq.App(dsns["owner"]) as owner:
        owner.tenants.set("acme", weight=2.0, max_running=3)
    with fairq.App(dsns["producer"]) as producer:
        ids = producer.enqueue_many("t", [("acme", {"n": i}) for i in range(20)])
        ids += producer.enqueue_many("t", [("globex", {"n": i}) for i in range(20)])
        flaky = producer.enqueue("flaky", tenant="acme", max_attempts=1)
        later = producer.enqueue("t", tenant="acme", delay=3600)
    seen: list[int] = []
    with fairq.App(dsns["worker"]) as worker_app:
        @worker_app.task(name="t")
        def t(job: fairq.Job) -> None:
            job.extend_lease()
            seen.append(job.payload["n"])

        @worker_app.task(name="flaky", max_attempts=1)
        def flaky_task(job: fairq.Job) -> None:
            raise RuntimeError("boom")

        w = worker_app.worker(concurrency=4, poll_interval=0.2, reap_interval=0.2)
        with caplog.at_level("WARNING", logger="fairq"):
            w.run(until_empty=True)
        assert w.stats.db_errors == 0
        assert "alembic_version" not in caplog.text  # the grant lets it check the revision
        assert "registry" not in caplog.text  # it wrote (and deleted) its registry row
    assert sorted(seen) == sorted(list(range(20)) * 2)
    with fairq.App(dsns["owner"]) as owner:
        statuses = {owner.job(i).status for i in ids}  # type: ignore[union-attr]
        assert statuses == {"done"}
        assert owner.job(flaky).status == "failed"  # type: ignore[union-attr]
        assert owner.cancel(later)
        assert owner.store.prune_finished(0) == 42
    code, out, err = cli("--dsn", dsns["monitor"], "stats", "--json")
    assert code == 0, err
    assert {r["tenant"] for r in json.loads(out)["tenants"]} >= {"acme", "globex"}
    code, out, err = cli("--dsn", dsns["monitor"], "tenants", "explain", "acme", "--json")
    assert code == 0, err
    assert json.loads(out) == [{**json.loads(out)[0], "queue": None, "reason": "no_jobs"}]


def test_periodic_schedules_need_the_producer_grants_and_never_stop_the_worker(
        dsns: dict[str, str], caplog: pytest.LogCaptureFixture) -> None:
    with fairq.App(dsns["producer"]) as producer:
        job_id = producer.enqueue("p", tenant="acme")
    with fairq.App(dsns["worker"]) as app:
        app.task(name="p")(lambda job: None)
        app.periodic("p", cron="* * * * *", tenant="acme")
        sql(dsns["owner"], "INSERT INTO fairq.periodic (name, tenant, task, cron, last_tick) "
                           "VALUES ('p', 'acme', 'p', '* * * * *', now() - interval '1 hour')")
        w = app.worker(poll_interval=0.2, queues=["default"])
        with caplog.at_level("WARNING", logger="fairq"):
            w.run(until_empty=True)  # may not enqueue: the schedule is off, the job still runs
        assert "periodic schedules disabled" in caplog.text and w.stats.db_errors == 0
        assert app.store.periodic_state([("p", "acme")])[1][("p", "acme")] is not None
    with fairq.App(dsns["owner"]) as owner:
        assert owner.job(job_id).status == "done"  # type: ignore[union-attr]
    sql(dsns["superuser"], "GRANT fq_producer TO fq_worker")
    try:
        with fairq.App(dsns["worker"]) as app:
            app.task(name="p")(lambda job: None)
            app.periodic("p", cron="* * * * *", tenant="acme")
            app.worker(poll_interval=0.2, queues=["default"]).run(until_empty=True)
        rows = sql(dsns["owner"], "SELECT count(*), array_agg(status) FROM fairq.jobs "
                                  "WHERE task = 'p' AND id <> %s", (job_id,))
        assert rows == [(1, ["done"])]  # the missed tick, enqueued and run once
    finally:
        sql(dsns["superuser"], "REVOKE fq_producer FROM fq_worker")
        sql(dsns["owner"], "DELETE FROM fairq.periodic")


def test_worker_without_the_revision_grant_starts_with_a_warning(
        dsns: dict[str, str], caplog: pytest.LogCaptureFixture) -> None:
    sql(dsns["owner"], "REVOKE SELECT ON fairq.alembic_version FROM fq_worker")
    try:
        with fairq.App(dsns["worker"]) as app:
            app.task(name="t")(lambda job: None)
            with caplog.at_level("WARNING", logger="fairq.worker"):
                app.worker(poll_interval=0.2, queues=["nothing-here"]).run(until_empty=True)
        assert "cannot read fairq.alembic_version to check the schema's revision" in caplog.text
    finally:
        sql(dsns["owner"], "GRANT SELECT ON fairq.alembic_version TO fq_worker")


def test_producer_can_only_enqueue(dsns: dict[str, str]) -> None:
    p = dsns["producer"]
    with fairq.App(p) as app:
        job_id = app.enqueue("t", tenant="p")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.job(job_id)  # cannot read jobs (payloads of other tenants)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.cancel(job_id)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.tenants.set("p", weight=100.0)
    store = Store(p, "fairq")
    try:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            store.claim(get_policy("fifo"), queue="default", batch=1, worker="evil")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            store.reap_expired()
    finally:
        store.close()
    assert denied(p, "DELETE FROM fairq.jobs")
    assert denied(p, "SELECT payload FROM fairq.jobs")
    assert denied(p, "UPDATE fairq.tenant_schedule SET running = 0, max_running = 1000")
    assert denied(p, "UPDATE fairq.jobs SET status = 'done'")
    assert denied(p, "CREATE TABLE fairq.x (i int)")
    assert denied(p, "TRUNCATE fairq.jobs")


# A producer that could write the schedule could pick its own place in line: these are refused.
PRODUCER_REFUSED = (
    "INSERT INTO fairq.tenant_schedule (queue, tenant, weight, max_running, vtime, active) "
    "VALUES ('default', 'evilcorp', 1000000, 1000000, -1e300, true)",
    "UPDATE fairq.tenant_schedule SET vtime = -1e308 WHERE tenant = 'acme'",
    "UPDATE fairq.tenant_schedule SET active = false, wake_at = 'infinity' WHERE tenant = 'rival'",
    "INSERT INTO fairq.jobs (queue, tenant, task) VALUES ('default', 'acme', 'x')",
    "UPDATE fairq.jobs SET status = 'queued', attempts = 0",
    "SELECT id FROM fairq.jobs",
    "SELECT vtime FROM fairq.tenant_schedule",
    "SELECT weight FROM fairq.tenants",
    "INSERT INTO fairq.settings VALUES ('tenant_defaults', '{}')",
)


def test_producer_cannot_touch_the_schedule_but_enqueues_every_way(dsns: dict[str, str]) -> None:
    p = dsns["producer"]
    with fairq.App(dsns["owner"]) as owner:
        owner.enqueue("t", tenant="acme")
        owner.enqueue("t", tenant="rival")
    schedule = ("SELECT queue, tenant, weight, max_running, vtime, active, wake_at "
                "FROM fairq.tenant_schedule WHERE tenant IN ('acme', 'rival') ORDER BY 1, 2")
    before = sql(dsns["owner"], schedule)
    for statement in PRODUCER_REFUSED:
        assert denied(p, statement), statement
    with fairq.App(p) as app:
        one = app.enqueue("t", tenant="acme", payload={"n": 1})
        many = app.enqueue_many("t", [("acme", {"n": 2}), ("rival", {"n": 3}, "k-roles")])
        again = app.enqueue("t", tenant="rival", key="k-roles")
    [(by_sql,)] = sql(p, "SELECT fairq.enqueue(task => 't', tenant => 'newco', "
                         "payload => '{\"n\": 4}'::jsonb, queue => 'reports', priority => 2)")
    assert again == many[1]
    code, out, err = cli("--dsn", p, "enqueue", "t", "--no-app", "--tenant", "rival", "--key", "k-roles")
    assert (code, out.strip()) == (0, str(many[1])), err
    rows = sql(dsns["owner"], "SELECT id, tenant, payload->>'n', queue, priority FROM fairq.jobs "
                              "WHERE id = ANY(%s) ORDER BY id", ([one, *many, by_sql],))
    assert rows == [(one, "acme", "1", "default", 0), (many[0], "acme", "2", "default", 0),
                    (many[1], "rival", "3", "default", 0), (by_sql, "newco", "4", "reports", 2)]
    assert sql(dsns["owner"], schedule) == before  # busy tenants' rows are the claimers' to write
    assert sql(dsns["owner"], "SELECT weight, max_running, active FROM fairq.tenant_schedule "
                              "WHERE tenant = 'newco'") == [(1.0, 10, True)]
    # The functions' own checks hold for the producer too, with their own SQLSTATE.
    with pytest.raises(psycopg.Error) as refused:
        sql(p, "SELECT fairq.enqueue(task => 't', tenant => 'x', cost => -1)")
    assert refused.value.sqlstate == "FQ001"
    # EXECUTE is the producer's only, not PUBLIC's: the monitor (USAGE on the schema) cannot.
    assert denied(dsns["monitor"], "SELECT fairq.enqueue(task => 't', tenant => 'm')")


def test_reapplying_the_roles_takes_back_older_producer_table_grants(dsns: dict[str, str]) -> None:
    owner = dsns["owner"]
    sql(owner, "GRANT INSERT (queue, tenant, weight, max_running, vtime, active, wake_at) "
               "ON fairq.tenant_schedule TO fq_producer")
    sql(owner, "GRANT UPDATE (active, vtime, wake_at) ON fairq.tenant_schedule TO fq_producer")
    assert not denied(dsns["producer"], "UPDATE fairq.tenant_schedule SET active = true WHERE false")
    code, _, err = cli("--dsn", owner, "roles", "--apply", "--producer", "fq_producer")
    assert code == 0, err
    for statement in (*PRODUCER_REFUSED, "UPDATE fairq.tenant_schedule SET active = true WHERE false"):
        assert denied(dsns["producer"], statement), statement


def test_worker_can_only_claim_and_finish(dsns: dict[str, str]) -> None:
    wk = dsns["worker"]
    with fairq.App(wk) as app:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.enqueue("t", tenant="w")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.tenants.set("w", weight=100.0)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.store.prune_finished(0)  # unless granted --worker-prune
    assert denied(wk, "DELETE FROM fairq.jobs")
    assert denied(wk, "INSERT INTO fairq.tenants VALUES ('w', 1, 1, now())")
    assert denied(wk, "DROP TABLE fairq.jobs")
    assert denied(wk, "CREATE TABLE fairq.x (i int)")
    assert denied(wk, "TRUNCATE fairq.jobs")


WORKER_REFUSED = (
    # The reproduction: a worker rewriting a tenant's weight and cap, or a job's task and payload.
    "UPDATE fairq.tenant_schedule SET weight = 1000, max_running = 1000",
    "UPDATE fairq.jobs SET status = 'queued', task = 'x', payload = '{\"injected\":1}', "
    "attempts = 0",
    "UPDATE fairq.tenant_schedule SET weight = 1000",
    "UPDATE fairq.tenant_schedule SET max_running = 1000",
    "UPDATE fairq.jobs SET payload = '{}'",
    "UPDATE fairq.jobs SET task = 'x'",
    "UPDATE fairq.jobs SET tenant = 'x'",
    "UPDATE fairq.jobs SET queue = 'x'",
    "UPDATE fairq.jobs SET priority = 100, cost = 0.001",
    "UPDATE fairq.jobs SET max_attempts = 1000, lease_seconds = 86400",
    "INSERT INTO fairq.tenant_schedule (queue, tenant) VALUES ('default', 'evilcorp')",
    "INSERT INTO fairq.settings VALUES ('tenant_defaults', "
    "'{\"weight\": 1000, \"max_running\": 1000}') "
    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    "INSERT INTO fairq.settings VALUES ('x', '{}')",
    "UPDATE fairq.tenants SET weight = 1000",
    # The group factors: the attack deleted a queue's rows and put in its own.
    "DELETE FROM fairq.group_schedule",
    "INSERT INTO fairq.group_schedule VALUES ('default', 'g1', 1e6, 'infinity')",
    "UPDATE fairq.group_schedule SET factor = 1e6, refreshed_at = 'infinity'",
    "TRUNCATE fairq.group_schedule",
    "INSERT INTO fairq.tenant_groups VALUES ('g1', 1000, now())",
)


@pytest.mark.parametrize("statement", WORKER_REFUSED)
def test_worker_cannot_change_weights_caps_payloads_or_tasks(dsns: dict[str, str],
                                                             statement: str) -> None:
    with fairq.App(dsns["owner"]) as owner:
        owner.tenants.apply({"defaults": {"weight": 1.0, "max_running": 10}})
    with fairq.App(dsns["producer"]) as producer:
        producer.enqueue("t", tenant="victim", payload={"n": 1})
    assert denied(dsns["worker"], statement), statement


def test_group_factors_come_from_the_configuration_whoever_claims(dsns: dict[str, str]) -> None:
    """The worker cannot write group_schedule, yet its claims refresh the factors (through
    refresh_groups, which runs as the owner and computes them itself); and the issue's rows are
    refused even to the owner: a factor beyond what weights allow, a refresh at infinity."""
    with fairq.App(dsns["owner"]) as owner:
        owner.groups.set("g1", weight=3.0)
        owner.tenants.set("grp-a", group="g1")
        owner.tenants.set("grp-b", group="g1", weight=2.0)
    with fairq.App(dsns["producer"]) as producer:
        producer.enqueue_many("g", [(t, {}) for t in ("grp-a", "grp-b", "grp-c")])
    store = Store(dsns["worker"], "fairq")
    try:
        claimed = store.claim(get_policy("weighted"), queue="default", batch=1, worker="w")
        assert claimed
        store.finish_done([(j.id, j.attempts) for j in claimed])
    finally:
        store.close()
    rows = dict(sql(dsns["owner"], "SELECT tenant_group, factor FROM fairq.group_schedule "
                                   "WHERE queue = 'default'"))
    assert rows["g1"] == pytest.approx(1.0)  # 3 / (1 + 2)
    for attack in ("INSERT INTO fairq.group_schedule VALUES ('default', 'g9', 1e6 * 2, now())",
                   "INSERT INTO fairq.group_schedule VALUES ('default', 'g9', 1, 'infinity')",
                   "INSERT INTO fairq.group_schedule VALUES ('default', 'g9', 0, now())"):
        with pytest.raises(psycopg.errors.CheckViolation):
            sql(dsns["owner"], attack)
    # The effective weight stays within the documented range whatever factor is stored.
    assert sql(dsns["owner"], "SELECT fairq.effective_weight(1000, 1e6)") == [(1000.0,)]
    sql(dsns["owner"], "DELETE FROM fairq.tenant_groups; DELETE FROM fairq.group_schedule; "
                       "UPDATE fairq.tenants SET tenant_group = NULL; "
                       "UPDATE fairq.tenant_schedule SET tenant_group = NULL")


def test_worker_cannot_store_a_run_at_no_client_can_read(dsns: dict[str, str]) -> None:
    """The worker may move run_at (retries wait in it), never out of the supported range."""
    with fairq.App(dsns["producer"]) as producer:
        job_id = producer.enqueue("t", tenant="bc", delay=3600)
    for when in ("0044-03-15 BC", "infinity", "9999-06-01", "1969-12-31 23:59:59+00"):
        with pytest.raises(psycopg.errors.CheckViolation):
            sql(dsns["worker"], "UPDATE fairq.jobs SET run_at = %s::timestamptz WHERE id = %s",
                (when, job_id))
    sql(dsns["owner"], "DELETE FROM fairq.jobs WHERE id = %s", (job_id,))


def test_worker_cannot_rewrite_the_tenant_defaults(dsns: dict[str, str]) -> None:
    """Row-level security hides the defaults' row from a worker's UPDATE: nothing changes."""
    with fairq.App(dsns["owner"]) as owner:
        owner.tenants.apply({"defaults": {"weight": 1.0, "max_running": 10}})
    sql(dsns["worker"], "UPDATE fairq.settings SET value = '{\"weight\": 1000, "
                        "\"max_running\": 1000}' WHERE key = 'tenant_defaults'")
    with fairq.App(dsns["owner"]) as owner:
        assert owner.store.get_defaults() == (1.0, 10)


def test_reapplying_the_roles_removes_older_table_wide_grants(dsns: dict[str, str]) -> None:
    """An installation whose worker got the older table-wide UPDATE: `roles --apply` again."""
    sql(dsns["owner"], "GRANT UPDATE ON fairq.jobs, fairq.tenant_schedule TO fq_worker")
    assert not denied(dsns["worker"], "UPDATE fairq.jobs SET payload = payload")
    code, _, err = cli("--dsn", dsns["owner"], "roles", "--apply", "--worker", "fq_worker")
    assert code == 0, err
    assert denied(dsns["worker"], "UPDATE fairq.jobs SET payload = payload")
    assert denied(dsns["worker"], "UPDATE fairq.tenant_schedule SET weight = weight")
    assert not denied(dsns["worker"], "UPDATE fairq.jobs SET locked_by = locked_by")


def test_worker_role_runs_every_maintenance_statement(dsns: dict[str, str]) -> None:
    """What a worker does besides claiming and finishing, under its role: reap, wake, rebase
    the virtual time, hand back, the maintenance stamps."""
    with fairq.App(dsns["producer"]) as producer:
        job_id = producer.enqueue("t", tenant="maint", lease=30)
    store = Store(dsns["worker"], "fairq")
    try:
        (claimed,) = [j for j in store.claim(get_policy("weighted"), queue="default", batch=50,
                                             worker="w") if j.id == job_id] or [None]
        assert claimed is not None
        assert store.extend_leases([(job_id, claimed.attempts)]) == {job_id}
        assert store.release_unstarted([(job_id, claimed.attempts)]) == {job_id}
        sql(dsns["owner"], "UPDATE fairq.jobs SET status = 'running', attempts = 1, "
                           "locked_until = now() - interval '1 s' WHERE id = %s", (job_id,))
        sql(dsns["owner"], "UPDATE fairq.tenant_schedule SET running = running + 1 "
                           "WHERE tenant = 'maint'")
        assert store.reap_expired().total >= 1
        store.wake_due_tenants()
        store.wake_stranded_tenants()
        assert store.rebase_vtime(threshold=0.0) >= 0
        assert store.maintenance_due("roles-test", 0.0)
        register_worker(store, "roles-test", queues=["default"], policy="weighted",
                        beat_seconds=1.0)
        register_worker(store, "roles-test", queues=["default"], policy="weighted",
                        beat_seconds=1.0)
        unregister_worker(store, "roles-test")
        store.vacuum_tenant_schedule()  # not the owner: PostgreSQL skips it with a warning
    finally:
        store.close()


def test_worker_under_the_producer_role_stops_with_one_line(dsns: dict[str, str],
                                                            tmp_path: Path) -> None:
    """No loop of tracebacks: one line, exit 2, even with --until-empty."""
    with fairq.App(dsns["producer"]) as app:
        app.task(name="t")(lambda job: None)
        with pytest.raises(fairq.InvalidInput, match="may not run a worker"):
            app.worker(poll_interval=0.2).run(until_empty=True)
    (tmp_path / "prod_tasks.py").write_text(
        "import fairq\napp = fairq.App()\napp.task(name='t')(lambda job: None)\n")
    proc = subprocess.run([sys.executable, "-m", "fairq", "--dsn", dsns["producer"], "worker",
                           "prod_tasks:app", "--until-empty"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "fairq worker:" in line]
    assert len(errors) == 1 and "may not run a worker" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_monitor_is_read_only_and_the_exporter_works(dsns: dict[str, str]) -> None:
    from prometheus_client import generate_latest

    from fairq.metrics.exporter import build_registry

    m = dsns["monitor"]
    with fairq.App(dsns["producer"]) as producer:
        producer.enqueue("t", tenant="mon", delay=3600)
    registry = build_registry(m, "fairq", interval=0, probe_source="auto")
    text = generate_latest(registry).decode()
    assert 'fairq_tenant_queued_jobs{queue="default",tenant="mon"} 1.0' in text, text[:3000]
    with fairq.App(m) as app:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.enqueue("t", tenant="m")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.tenants.set("m", weight=2.0)
        assert app.tenants.list() is not None  # reading is fine
    for statement in ("DELETE FROM fairq.jobs", "UPDATE fairq.jobs SET status = 'done'",
                      "UPDATE fairq.tenant_schedule SET running = 0",
                      "INSERT INTO fairq.settings VALUES ('x', '{}')", "TRUNCATE fairq.jobs"):
        assert denied(m, statement), statement


def test_roles_print_and_bad_role_names(dsns: dict[str, str], tmp_path: Path) -> None:
    code, out, _ = cli("roles", "--print", "--worker", "w", "--worker-prune")
    assert code == 0 and 'GRANT DELETE ON "fairq".jobs TO "w"' in out
    code, out, _ = cli("--schema", "other", "roles", "--print", "--monitor", "m")
    assert code == 0 and 'SCHEMA "other"' in out
    for argv in (["roles", "--print", "--worker", "W; DROP"], ["roles", "--print"],
                 ["roles", "--print", "--worker-prune"], ["roles", "--worker", "w"]):
        code, out, err = cli(*argv)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (argv, err)
