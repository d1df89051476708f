"""fairq's SQL functions trust no search path: each pins ``pg_catalog, pg_temp``, or (the small
sql functions PostgreSQL inlines, which a SET clause would stop) names nothing through one. A
role that may create objects in ``public`` plants operators there that would copy every
tenant's payloads into its own table; workers and the exporter, whose sessions search
``public``, run the claims, finishes and scrapes, and nothing reaches the table."""

from __future__ import annotations

import contextlib
import io
import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from prometheus_client import generate_latest

import fairq
from fairq.cli import main
from fairq.metrics.exporter import build_registry
from fairq.policies import get_policy
from fairq.store import Store
from tests.support.fault_tools import sql

PINNED = ["search_path=pg_catalog, pg_temp"]
# The sql functions left unpinned so that PostgreSQL inlines them (test_migrations checks it).
INLINED = {"effective_weight", "tenant_tokens", "claim_room", "tenant_dry", "token_due",
           "token_at", "throttled_open", "throttled_total", "returns_lock", "run_average",
           "wait_reason"}
# Grammar, not names looked up: keywords before a parenthesis, and the expressions PostgreSQL
# parses itself (COALESCE, LEAST, GREATEST, EXTRACT, which it maps to pg_catalog.extract).
GRAMMAR = {"SELECT", "CASE", "WHEN", "THEN", "ELSE", "END", "AND", "OR", "NOT", "IS", "NULL",
           "FROM", "COALESCE", "LEAST", "GREATEST", "EXTRACT", "AS", "IN"}


def path_lookups(src: str) -> list[str]:
    """What a sql function's body would look up through the caller's search_path: operators
    not written OPERATOR(pg_catalog.op), casts to a type not in pg_catalog, unqualified
    function calls."""
    body = re.sub(r"--[^\n]*", "", re.sub(r"'[^']*'", "''", src))
    found = [f"cast to {t}" for t in re.findall(r"::\s*([\w.]+)", body)
             if not t.startswith("pg_catalog.")]
    bare = re.sub(r"OPERATOR\(pg_catalog\.[^)]+\)", " ", body).replace("::", " ")
    bare = re.sub(r"\w+\s*=>", " ", re.sub(r"\b\d+(\.\d+)?(e[+-]?\d+)?\b", "0", bare))
    found += [f"operator {op}" for op in re.findall(r"[-+*/<>=~!@#%^&|`?]+", bare)]
    found += [f"function {f}" for f in re.findall(r"([\w.\"]+)\s*\(", bare)
              if "." not in f and f.upper() not in GRAMMAR]
    return found


def test_the_lint_sees_what_the_baseline_left_to_the_search_path() -> None:
    assert path_lookups("SELECT least(s.max_running - s.running, "
                        "floor(t(s) + 1e-9)::int)") == [
        "cast to int", "operator -", "operator +", "function floor", "function t"]
    assert path_lookups("SELECT LEAST(a OPERATOR(pg_catalog.*) COALESCE(b, "
                        "1::pg_catalog.float8), pg_catalog.now())") == []


def test_every_function_pins_its_search_path_or_names_nothing_through_it(dsn: str) -> None:
    rows = sql(dsn, "SELECT p.proname, p.proconfig, l.lanname, p.prosrc FROM pg_proc p "
                    "JOIN pg_namespace n ON n.oid = p.pronamespace "
                    "JOIN pg_language l ON l.oid = p.prolang WHERE n.nspname = 'fairq'")
    assert len(rows) >= 18
    unpinned = {name: (lang, src) for name, config, lang, src in rows if config != PINNED}
    assert set(unpinned) == INLINED, sorted(unpinned)
    for name, (lang, src) in unpinned.items():
        assert lang == "sql", name
        assert path_lookups(src) == [], (name, path_lookups(src))


# Operators a session searching public before pg_catalog picks even over an exact built-in match.
EXACT = (("float8", "float8", "+", "float8"), ("float8", "float8", "*", "float8"),
         ("float8", "float8", "<", "bool"), ("int4", "int4", "-", "int4"),
         ("timestamptz", "interval", "+", "timestamptz"), ("int8", "int8", "=", "bool"))
# Exact matches where an expression mixes float8 with numeric or int literals: chosen over the
# built-in operator that needs a cast even when pg_catalog comes first.
MIXED = (("float8", "numeric", "+", "float8"), ("float8", "int4", "<", "bool"),
         ("numeric", "float8", "*", "float8"), ("int4", "float8", "-", "float8"),
         ("float8", "numeric", "<", "bool"))


def plant(conn: psycopg.Connection[Any], operators: tuple[tuple[str, str, str, str], ...],
          prefix: str) -> None:
    """Operators in public whose function records a row in public.loot (every job's payloads)
    and then does what the built-in one would."""
    for i, (left, right, op, result) in enumerate(operators):
        fn = f"public.{prefix}_{i}"
        conn.execute(
            f"CREATE FUNCTION {fn}(a {left}, b {right}) RETURNS {result} LANGUAGE plpgsql AS $$ "
            "BEGIN INSERT INTO public.loot SELECT current_user, jsonb_agg(j.payload) "
            "FROM fairq.jobs j; "
            f"RETURN a::{result if result != 'bool' else left} OPERATOR(pg_catalog.{op}) "
            f"b::{right if result == 'bool' or left == 'timestamptz' else result}; END $$")
        conn.execute(f"CREATE OPERATOR public.{op} (LEFTARG = {left}, RIGHTARG = {right}, "
                     f"FUNCTION = {fn})")


@pytest.fixture(params=["public, fairq", "public, pg_catalog, fairq"])
def planted(dsn: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """The hijack from the issue: CREATE on public for everyone (PostgreSQL 14's default),
    sessions that search public (by the database's default), and a role that plants operators
    there that copy every job's payload into its table, public.loot (a row per call). With
    public before pg_catalog, operators of the built-in's exact types too."""
    role = f"fq_thief_{uuid.uuid4().hex[:8]}"
    db = sql(dsn, "SELECT current_database()")[0][0]
    sql(dsn, "GRANT CREATE ON SCHEMA public TO PUBLIC")
    sql(dsn, f"CREATE ROLE {role}")
    sql(dsn, f'ALTER DATABASE "{db}" SET search_path = {request.param}')
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"SET ROLE {role}")
            conn.execute("CREATE TABLE public.loot (who text, payload jsonb)")
            conn.execute("GRANT INSERT ON public.loot TO PUBLIC")
            plant(conn, MIXED, "steal")
            if "pg_catalog" in request.param:
                plant(conn, EXACT, "grab")
        yield request.param
    finally:
        sql(dsn, "DROP TABLE IF EXISTS public.loot")
        sql(dsn, f"DROP OWNED BY {role}")
        sql(dsn, f"DROP ROLE {role}")


def test_the_planted_operators_would_fire(dsn: str, planted: str) -> None:
    """The trap is live: an expression with those operand types, in a session searching public,
    runs the thief's function."""
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SHOW search_path").fetchone() == (planted,)
        conn.execute("SELECT 1::float8 + 1e-9")
        conn.commit()
    assert sql(dsn, "SELECT count(*) FROM public.loot") == [(1,)]
    if "pg_catalog" in planted:
        with psycopg.connect(dsn) as conn:
            conn.execute("SELECT 1::float8 + 1::float8")
            conn.commit()
        assert sql(dsn, "SELECT count(*) FROM public.loot") == [(2,)]


def test_workers_and_the_exporter_run_inert_beside_planted_operators(
        dsn: str, planted: str) -> None:
    with fairq.App(dsn) as app:
        app.tenants.set("acme", rate=1000.0, burst=1000)  # its bucket: claim_room's arithmetic
        app.groups.set("gold", weight=2.0)
        app.tenants.set("globex", group="gold")
        ids = app.enqueue_many("t", [(t, {"secret": f"{t}-{i}"})
                                     for t in ("acme", "globex", "initech") for i in range(10)])
        done: list[int] = []

        @app.task(name="t")
        def t(job: fairq.Job) -> None:
            done.append(job.id)

        for policy in ("weighted", "drr"):
            worker = app.worker(policy=policy, concurrency=2, poll_interval=0.05)
            worker.run(until_empty=True)
            assert worker.stats.db_errors == 0
            ids += app.enqueue_many("t", [("acme", {"secret": "late"})] * 3)
        worker = app.worker(policy="weighted", concurrency=2, poll_interval=0.05)
        worker.run(until_empty=True)
        assert sorted(done) == sorted(ids)  # each job claimed once, all done
        assert {app.job(i).status for i in ids} == {"done"}  # type: ignore[union-attr]
        assert {app.job(i).attempts for i in ids} == {1}  # type: ignore[union-attr]
        # A failure with the backoff, a hand-back and a retry, through the store's statements.
        failing = app.enqueue_many("t", [("acme", {"secret": "f"}), ("globex", {"secret": "g"})])
        store = Store(dsn, "fairq", min_size=1, max_size=1)
        try:
            jobs = store.claim(get_policy("weighted"), queue="default", batch=2, worker="w")
            assert sorted(j.id for j in jobs) == sorted(failing)
            store.finish_failed([(jobs[0].id, jobs[0].attempts, "boom", None)])
            assert store.release_unstarted([(jobs[1].id, jobs[1].attempts)]) == {jobs[1].id}
        finally:
            store.close()
        assert app.job(jobs[0].id).status == "queued"  # type: ignore[union-attr]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(["--dsn", dsn, "stats", "--json"]) == 0, err.getvalue()
    assert {r["tenant"] for r in json.loads(out.getvalue())["tenants"]} >= {"acme", "globex"}
    registry = build_registry(dsn, "fairq", interval=0, probe_source="auto")
    text = generate_latest(registry).decode()
    assert 'fairq_tenant_queued_jobs{queue="default",tenant="acme"}' in text
    assert sql(dsn, "SELECT count(*) FROM public.loot") == [(0,)]


def test_inlined_functions_name_nothing_whatever_the_callers_path(
        dsn: str, planted: str) -> None:
    """The inlined functions are parsed in the calling session, under its search_path (public
    first in one case, so even exact built-in matches are losable): they still call only
    pg_catalog's operators."""
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT fairq.enqueue('t', 'acme')")
        conn.execute("UPDATE fairq.tenant_schedule SET rate = 5, burst = 5, tokens = 0.5, "
                     "refilled_at = now(), throttled_since = now() - interval '1 second'")
        row = conn.execute(
            "SELECT fairq.claim_room(ts), fairq.tenant_dry(ts), "
            "fairq.token_due(ts) OPERATOR(pg_catalog.>) pg_catalog.now(), "
            "fairq.throttled_total(ts) OPERATOR(pg_catalog.>) 0::float8, "
            "fairq.effective_weight(ts.weight, 2) FROM fairq.tenant_schedule ts").fetchone()
        assert row == (0, True, True, True, 2.0)
        assert conn.execute("SELECT count(*) FROM public.loot").fetchone() == (0,)


@pytest.mark.parametrize("pooler", [False, True])
def test_fairqs_own_sessions_search_only_pg_catalog(dsn: str, pooler: bool) -> None:
    """The store's sessions (a direct connection's options, a pooled one's per-transaction
    settings) search only pg_catalog, whatever the database's default says: the named
    statements name everything of fairq's by schema."""
    db = sql(dsn, "SELECT current_database()")[0][0]
    sql(dsn, f'ALTER DATABASE "{db}" SET search_path = public, fairq')
    store = Store(dsn, "fairq", min_size=1, max_size=1, pooler=pooler)
    try:
        with store.cursor() as cur:
            cur.execute("SELECT replace(current_setting('search_path'), ' ', '') AS path")
            assert cur.fetchone() == {"path": "pg_catalog,pg_temp"}
    finally:
        store.close()
