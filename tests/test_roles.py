"""Least privilege (issue 7, docs/roles.md): on a private cluster, an owner migrates and applies
``fairq roles --apply``; then each part runs as its own role with only those grants (producers
enqueue, workers claim and finish, the monitor reads stats and metrics) and each role is shown
what it cannot do."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from helpers.fault_tools import private_cluster, sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import fairq
from fairq.cli import main
from fairq.policies import get_policy
from fairq.store import Store

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
    code, out, err = cli("--dsn", p, "enqueue", "t", "--tenant", "rival", "--key", "k-roles")
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


def test_monitor_is_read_only_and_the_exporter_works(dsns: dict[str, str]) -> None:
    from prometheus_client import generate_latest

    from fairq.exporter import build_registry

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
