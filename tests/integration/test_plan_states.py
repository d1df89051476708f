"""EXPLAIN guards in every statistics state, for every claim and finish statement and for the
statements the engine's plpgsql functions run (claim_fair, wait_and_pick, claim_settle,
queue_vtime, ...).

tests/integration/test_claim_plans.py checks the claims on freshly analyzed databases. The plans must also
hold in the states a real database passes through. Each state is a database of its own, copied
from the migrated template, loaded through the public API (``App.enqueue_many``) and with
autovacuum off on its tables, so the state stays the one it was built as:

- ``never_analyzed``: a whale of 5,000 jobs enqueued first, then 100 tenants x 50 jobs; no ANALYZE.
- ``analyzed_empty``: ANALYZE right after the migration, then the same load.
- ``analyzed_before_bulk``: 5 tenants x 2 jobs, ANALYZE, then the same load.
- ``analyzed_one_tenant``: one tenant's 2 jobs, ANALYZE, then 400 tenants with a job each and the
  same load: a queue whose first customer came alone, then the others (tenant_schedule's
  statistics say one row). Without ``enable_sort = off`` the walk read the whole queue's tenants
  by tenant_schedule_pkey and sorted them, in every fair claim.
- ``skewed``: the whale holds ~95% of the jobs (9,500; 100 tenants x 3), then ANALYZE.
- ``fresh``: the load of the first state, then ANALYZE.
- ``vacuumed``: the load of the first state, then VACUUM without ANALYZE: row and page counts in
  pg_class, no column statistics. A database whose autovacuum is off is in this state once a
  worker's maintenance has vacuumed tenant_schedule (``vacuum_tenant_schedule``, about every
  second under load); the estimates then rest on real table sizes and default selectivities.

Every state also holds two sleepers (one delayed job each, due by the time the cases run: a fair
claim wakes them, serves them and claim_settle retires them), 200 idle tenants (their only job an
hour away), a queue ``held`` whose due jobs another transaction holds locked (the fair claim takes
nothing, walks every tenant, and its second statement, ``wait``, asks wait_and_pick for a tenant
to wait for) and a queue ``capped`` whose only tenant is at its cap (queue_vtime's second query).
Weights are 1..4 and costs 1..3, so weighted and drr take their real arithmetic paths.

Each case runs in a new session with fairq's planner settings (``planner_options()``) under
``plan_cache_mode`` = ``force_generic_plan`` (the plan the session caches, as fairq's workers run
it) or ``force_custom_plan``, in a transaction that is rolled back. The statement is executed as
psycopg executes it for the Store (a prepared statement, the real parameters; a claim that took
nothing while it held a lock, under a policy that waits, is run again with ``wait``), and auto_explain
(``log_analyze``, ``log_nested_statements``, JSON, ``log_level`` notice) sends the plan of that
statement, and of every statement run inside the functions it calls, back to this session as
notices: what is checked is the plan that ran, with its actual row counts. Finishes run on the
jobs a fair claim took earlier in the same transaction. ``test_every_function_statement_is_checked``
proves the cases run every statement of every engine function.

The guards (``node_problems``, ``case_problems``), on every plan node of jobs or tenant_schedule:
no Seq Scan; a tenant's jobs are read through jobs_tenant_ready_idx with the tenant in the Index
Cond (never through jobs_fifo_ready_idx, or any index, with a Filter on the tenant, never by a
bitmap scan that reads all of them); jobs_fifo_ready_idx is read by claim_fifo alone; other job
lookups use the primary key; a tenant_schedule row looked up by tenant is read through
tenant_schedule_pkey with the tenant in the Index Cond, by ctid through a Tid Scan; a walk over a
queue's tenants reads tenant_schedule_runnable_idx (the sleepers: the due or wake index;
queue_vtime's capped query: the capped index); no node touches (rows returned + removed, over
its loops) more than 3 x batch + 2 rows, nor removes more than batch + 2 by its Filter, so the
whale's 5,000 jobs, the other 100 tenants or the idle ones never show up; and per case: the rows
returned (a full batch for a claim, with the whale's and the sleepers' jobs in it), the plan mode
asked for, the functions the case must run did run, and the indexes it must read were read.
Structural rules apply to never-executed nodes too; the row bounds to what ran.

A case in which defects catalogued in ``DEFECTS`` show up where ``KNOWN`` expects them (per
server version) is an expected failure, strict: it fails once they are gone, so that the entry
gets removed. Anything else the guards find fails the test. The last tests prove the guards
trip: on synthetic plan nodes, one per rule, and on real plans with index scans disabled and
with the old jobs_fifo_ready_idx definition as the only way to a tenant's jobs.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest

from fairq import App, sql
from fairq.models import TenantConfig
from fairq.policies import get_policy
from fairq.store.planner import planner_options
from tests.conftest import SCHEMA, create_database, drop_database, dsn_for_db
from tests.support.fairtools import holding_row

BATCH = 10
QUEUE, HELD, CAPPED = "default", "held", "capped"
WHALE = "t000-whale"  # the walk (vtime, tenant) meets it first of the tenants with jobs
TENANTS = [f"t{i:03d}" for i in range(1, 101)]
SLEEPERS = ("s1", "s2")
# A sleeper whose only job was cancelled: woken by a claim that finds nothing to take from it,
# so claim_settle's retirement of tenants it did not serve runs (served ones retire earlier).
EMPTY_SLEEPER = "s3"
# A runnable tenant whose only job was cancelled, before the whale in the walk: the walk goes
# past it, so claim_settle reads the tenants before the walk's stop (a walk that served every
# row it locked does not).
WALKED_PAST = "t000-a"
IDLE = [f"idle{i:03d}" for i in range(200)]  # idle tenants: their only job is an hour away
CROWD = 400  # analyzed_one_tenant's extra runnable tenants, u0000.. (after the whale in the walk)
HELD_TENANTS = ("h1", "h2", "h3")
CAPPED_TENANT = "c1"
SLEEP_SECONDS = 1.0
# Rows one scan node may touch (returned + removed by filter or recheck, over all its loops): a
# batch and the probes around it. The whale's 5,000 jobs, or the other 100 tenants, must not
# show up here.
MAX_NODE_ROWS = 3 * BATCH + 2
MAX_FILTERED = BATCH + 2
TABLES = ("jobs", "tenant_schedule")
STATES = ("never_analyzed", "analyzed_empty", "analyzed_before_bulk", "analyzed_one_tenant",
          "skewed", "fresh", "vacuumed")
MODES = ("generic", "custom")


# -- states ---------------------------------------------------------------------------------
def _tables(dsn: str, command: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for t in ("jobs", "tenant_schedule", "tenants", "settings"):
            conn.execute(command.format(f"{SCHEMA}.{t}"))


def _enqueue_backlog(app: App, *, whale: int, per_tenant: int) -> None:
    """The whale's jobs first, then the tenants' jobs interleaved (FIFO order round-robins them),
    the sleepers, the held queue and the capped queue."""
    app.store.set_tenants([TenantConfig(t, 1.0 + i % 4, 10) for i, t in enumerate(TENANTS)]
                          + [TenantConfig(CAPPED_TENANT, 1.0, 0)])
    for job_id in app.enqueue_many("plan", [(WALKED_PAST, None)]):
        app.cancel(job_id)
    app.enqueue_many("plan", [(WHALE, None)] * whale)
    for cost in (1, 2, 3):
        group = [t for i, t in enumerate(TENANTS) if i % 3 == cost - 1]
        app.enqueue_many("plan", [(t, {"k": k}) for k in range(per_tenant) for t in group],
                         cost=cost)
    app.enqueue_many("plan", [(t, None) for t in SLEEPERS], delay=SLEEP_SECONDS)
    for job_id in app.enqueue_many("plan", [(EMPTY_SLEEPER, None)], delay=SLEEP_SECONDS):
        app.cancel(job_id)
    app.enqueue_many("plan", [(t, None) for t in IDLE], delay=3600.0)
    app.enqueue_many("plan", [(t, None) for t in HELD_TENANTS for _ in range(2)], queue=HELD)
    app.enqueue_many("plan", [(CAPPED_TENANT, None)], queue=CAPPED)


def build_state(dsn: str, state: str) -> None:
    _tables(dsn, "ALTER TABLE {} SET (autovacuum_enabled = false)")
    with App(dsn, schema=SCHEMA) as app:
        if state == "analyzed_empty":
            _tables(dsn, "ANALYZE {}")
        elif state == "analyzed_before_bulk":
            app.enqueue_many("plan", [(t, None) for t in TENANTS[:5] for _ in range(2)])
            _tables(dsn, "ANALYZE {}")
        elif state == "analyzed_one_tenant":
            app.enqueue_many("plan", [(TENANTS[0], None)] * 2)
            _tables(dsn, "ANALYZE {}")
            # More runnable tenants than the load's 100: the runnable index grows a level.
            app.enqueue_many("plan", [(f"u{i:04d}", None) for i in range(CROWD)])
        if state == "skewed":
            _enqueue_backlog(app, whale=9_500, per_tenant=3)
        else:
            _enqueue_backlog(app, whale=5_000, per_tenant=50)
    if state in ("skewed", "fresh"):
        _tables(dsn, "ANALYZE {}")
    elif state == "vacuumed":
        _tables(dsn, "VACUUM {}")
        with psycopg.connect(dsn, autocommit=True) as conn:  # sizes known, no statistics
            sized = conn.execute(
                "SELECT c.relname, c.reltuples, (SELECT count(*) FROM pg_stats s "
                "WHERE s.schemaname = n.nspname AND s.tablename = c.relname) "
                "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relname = ANY (%s)", (SCHEMA, list(TABLES))).fetchall()
        assert len(sized) == 2 and all(tuples > 0 and stats == 0 for _, tuples, stats in sized), sized
    with psycopg.connect(dsn, autocommit=True) as conn:  # the sleepers are due before any case
        row = conn.execute(f"SELECT extract(epoch FROM max(wake_at) - now())::float8 "
                           f"FROM {SCHEMA}.tenant_schedule WHERE queue = %s AND tenant = ANY (%s)",
                           (QUEUE, list(SLEEPERS))).fetchone()
    assert row is not None and row[0] is not None
    time.sleep(max(0.0, row[0]) + 0.05)


class States:
    """One database per state, built on first use, dropped at the end of the module."""

    def __init__(self, admin_dsn: str, template: str) -> None:
        self.admin_dsn, self.template = admin_dsn, template
        self.names: dict[str, str] = {}
        self._server: int | None = None

    def dsn(self, state: str) -> str:
        if state not in self.names:
            name = create_database(self.admin_dsn, "fairq_pstate", template=self.template)
            self.names[state] = name
            build_state(dsn_for_db(self.admin_dsn, name), state)
        return dsn_for_db(self.admin_dsn, self.names[state])

    @property
    def server(self) -> int:
        """The server's major version."""
        if self._server is None:
            with psycopg.connect(self.admin_dsn) as conn:
                self._server = conn.info.server_version // 10_000
        return self._server

    def drop(self) -> None:
        for name in self.names.values():
            drop_database(self.admin_dsn, name)


@pytest.fixture(scope="module")
def states(admin_dsn: str, template_db: str) -> Iterator[States]:
    s = States(admin_dsn, template_db)
    try:
        yield s
    finally:
        s.drop()


# -- plans ----------------------------------------------------------------------------------
# The engine's functions (alembic/versions/0001_baseline/*.sql) are found in the database
# itself: a statement auto_explain reports from inside one is labelled "function: its first
# words".
ENGINE_FUNCTIONS = ("queue_vtime", "wait_and_pick", "claim_settle", "eff_weight", "claim_terms",
                    "groups_due", "claim_fair", "return_slots", "decay_usage", "fold_returns",
                    "fold_capped", "fold_stale_returns", "settle_capped", "tenant_running",
                    "give_ahead", "return_budgets")
FUNCTIONS_SQL = (f"SELECT {SCHEMA}.fold_stale_returns(-1.0) AS swept, "  # first: a claim folds
                 f"{SCHEMA}.queue_vtime(%(capped)s) AS v, "
                 f"(SELECT count(*) FROM {SCHEMA}.wait_and_pick(%(queue)s, 3, true, true, false)) AS picked, "
                 # claim_settle's read back from a walk's stop, which no claim passes today
                 # (claim_fair lists the tenants it went past): a stop before every tenant, so it
                 # reads nothing and retires nobody.
                 f"{SCHEMA}.claim_settle(%(queue)s, false, NULL, '-Infinity', '', '{{}}', '{{}}', "
                 "'{}', '{}', '{}', '{}', '{}') AS settled, "
                 # and its read of a walk's reach when it walked every candidate (no claim passes
                 # one either): a reach below every tenant, so it reads nothing.
                 f"{SCHEMA}.claim_settle(%(queue)s, true, '-Infinity', NULL, NULL, '{{}}', "
                 "'{}', '{}', '{}', '{}', '{}', '{}') AS settled_short, "
                 # the usage decay of workers with a half-life (rolled back with the case), once a
                 # correction of policy time has put the whale 5 s ahead of the queue
                 f"{SCHEMA}.return_slots(ARRAY[%(queue)s], ARRAY['{WHALE}'], ARRAY[0], NULL, "
                 "NULL, ARRAY[5.0::float8]) AS pushed, "
                 f"{SCHEMA}.decay_usage(%(queue)s, 0.5) AS decayed, "
                 # the folds of slots given back (RETURNS_SETUP put two there, one of them to a
                 # capped tenant; the maintenance's sweep, first, folds them), a claim's wait
                 # for a capped tenant's open finishes and the readers' count
                 f"{SCHEMA}.fold_capped(%(queue)s) AS folded_capped, "
                 f"{SCHEMA}.fold_returns(ARRAY[%(queue)s], ARRAY['{WHALE}']) AS folded, "
                 f"{SCHEMA}.settle_capped(ARRAY[%(queue)s], ARRAY['{WHALE}']) AS settled_capped, "
                 f"(SELECT {SCHEMA}.tenant_running(ts) FROM {SCHEMA}.tenant_schedule ts "
                 f"WHERE ts.queue = %(queue)s AND ts.tenant = '{WHALE}') AS running_now")
RETURNS_SETUP = (f"INSERT INTO {SCHEMA}.slot_returns (queue, tenant, n, capped) "
                 f"VALUES ('{QUEUE}', '{WHALE}', 1, true), ('{QUEUE}', '{WHALE}', 1, false)",
                 # and a slot counted ahead for a worker, which the sweep gives back
                 f"INSERT INTO {SCHEMA}.claim_budgets (queue, worker, tenant, slots) "
                 f"VALUES ('{QUEUE}', 'gone', '{WHALE}', 1)",
                 f"UPDATE {SCHEMA}.tenant_schedule SET running = running + 3 "
                 f"WHERE queue = '{QUEUE}' AND tenant = '{WHALE}'")
# Slots counted ahead for the cases' worker ("plan-states") at the whale (claim.sql, step 5a).
AHEAD_SETUP = (f"INSERT INTO {SCHEMA}.claim_budgets (queue, worker, tenant, slots) "
               f"VALUES ('{QUEUE}', 'plan-states', '{WHALE}', {BATCH})",)
# The whale alone runnable in its queue, its row held by another session (Case.hold_row): the
# walk takes nothing, and the worker starts jobs from its slots ahead.
ALONE_SETUP = (f"UPDATE {SCHEMA}.tenant_schedule SET active = false, wake_at = NULL "
               f"WHERE queue = '{QUEUE}' AND tenant <> '{WHALE}'",)
# A claim that serves the whale, alone runnable, for which the worker holds slots ahead: it
# counts more (give_ahead), within a cap with room for them.
TOPUP_SETUP = (f"UPDATE {SCHEMA}.tenant_schedule SET max_running = 1000 "
               f"WHERE queue = '{QUEUE}' AND tenant = '{WHALE}'",)
# A finish whose tenant's row another transaction holds: its slot goes to slot_returns.
RETURNS_SQL = (f"SELECT {SCHEMA}.return_slots(ARRAY[%(queue)s], ARRAY['{WHALE}'], ARRAY[1], "
               "NULL, NULL, ARRAY[0.5::float8], ARRAY[1], ARRAY[0.01::float8]) AS given, "
               f"(SELECT count(*) FROM {SCHEMA}.slot_returns r WHERE r.queue = %(queue)s) AS n")
END_MARK = "SELECT 'plan-states: end of case'"
_TOP = re.compile(r"^-- fairq (\w+)")
_TENANT_EQ = re.compile(r"\btenant = ")
_INTO = re.compile(r"(?<!INSERT )\bINTO\s+\w+(\s*,\s*\w+)*\s", re.IGNORECASE)
_COMMENT = re.compile(r"--[^\n]*")
_QUERY = re.compile(r"\b(SELECT|UPDATE|INSERT|DELETE)\b", re.IGNORECASE)


def normal(text: str) -> str:
    """SQL text as plpgsql hands a statement to the executor, made comparable: comments and
    ``INTO target`` removed, whitespace squashed."""
    return " ".join(_INTO.sub(" ", _COMMENT.sub(" ", text)).split())


def function_sources(conn: psycopg.Connection[Any]) -> dict[str, str]:
    """The engine functions of the schema: name -> body (``normal``)."""
    rows = conn.execute("SELECT p.proname, p.prosrc FROM pg_proc p JOIN pg_namespace n "
                        "ON n.oid = p.pronamespace WHERE n.nspname = %s AND p.proname = ANY (%s)",
                        (SCHEMA, list(ENGINE_FUNCTIONS))).fetchall()
    return {name: normal(src) for name, src in rows}


def as_run(src: str) -> str:
    """A (``normal``) body as its statements reach the executor: plpgsql runs `PERFORM x` as
    `SELECT x`."""
    return src.replace("PERFORM ", "SELECT ")


def function_statements(body: str) -> list[str]:
    """The statements of a (``normal``) plpgsql body that run a query: its ;-separated pieces
    with a SELECT, UPDATE, INSERT or DELETE in them."""
    return [piece.strip() for piece in body.split(";") if _QUERY.search(piece)]


@dataclass
class Logged:
    """One plan auto_explain reported: the statement's label (``claim_fair``, or a function's
    statement ``claim_settle: UPDATE "fairq".tenant_schedule ts SET``...), the function it ran
    in (None for the statement itself), its text and its plan."""

    label: str
    function: str | None
    text: str
    plan: dict[str, Any]


def parse_notice(message: str, sources: Mapping[str, str]) -> Logged | None:
    head, sep, body = message.partition("\n")
    if not sep or not head.startswith("duration:") or "plan:" not in head:
        return None
    doc = json.loads(body)
    text = str(doc.get("Query Text", ""))
    m = _TOP.match(text)
    if m:
        return Logged(m.group(1), None, text, doc["Plan"])
    if text == FUNCTIONS_SQL.replace("%(capped)s", "$1").replace("%(queue)s", "$2"):
        return Logged("functions", None, text, doc["Plan"])
    if text == RETURNS_SQL.replace("%(queue)s", "$1"):
        return Logged("returns", None, text, doc["Plan"])
    squashed = normal(text)
    function = next((f for f, src in sources.items() if squashed in as_run(src)), None)
    words = " ".join(squashed.split()[:6])
    return Logged(f"{function or 'other'}: {words}", function, text, doc["Plan"])


def walk(plan: Mapping[str, Any], ancestors: tuple[Mapping[str, Any], ...] = ()
         ) -> Iterator[tuple[Mapping[str, Any], tuple[Mapping[str, Any], ...]]]:
    yield plan, ancestors
    for child in plan.get("Plans", []):
        yield from walk(child, (*ancestors, plan))


def _relation(node: Mapping[str, Any]) -> str | None:
    rel = node.get("Relation Name")
    if rel is None and "Index Name" in node:  # a Bitmap Index Scan names its index only
        idx = str(node["Index Name"])
        rel = next((t for t in TABLES if idx.startswith(t + "_")), None)
    return None if rel is None else str(rel)


def describe(node: Mapping[str, Any]) -> str:
    parts = [str(node["Node Type"])]
    parts += [f"{key}: {node[key]}" for key in ("Index Name", "Relation Name", "Alias", "Index Cond",
                                                 "TID Cond", "Recheck Cond", "Filter") if key in node]
    parts.append(f"rows {node.get('Actual Rows')} x loops {node.get('Actual Loops')}, "
                 f"removed by filter {node.get('Rows Removed by Filter', 0)}")
    return "; ".join(parts)


def plan_tree(logged: Logged) -> str:
    return "\n".join(f"  {'  ' * len(anc)}{describe(node)}" for node, anc in walk(logged.plan))


def _touched(node: Mapping[str, Any]) -> float:
    per_loop = (float(node.get("Actual Rows", 0)) + float(node.get("Rows Removed by Filter", 0))
                + float(node.get("Rows Removed by Index Recheck", 0)))
    return float(node.get("Actual Loops", 0)) * per_loop


@dataclass(frozen=True)
class Problem:
    """A guard that tripped: in which statement, which part of it (the CTE, in a claim), which
    rule, and why (with the plan node)."""

    statement: str
    part: str
    rule: str
    detail: str = ""

    @property
    def key(self) -> str:
        where = f"{self.statement}[{self.part}]" if self.part else self.statement
        return f"{where} {self.rule}"

    def __str__(self) -> str:
        return f"{self.key}: {self.detail}"


def _part(node: Mapping[str, Any], ancestors: tuple[Mapping[str, Any], ...]) -> str:
    """The CTE a node computes (its nearest ancestor, or itself, named "CTE x"), or ''."""
    for n in (node, *reversed(ancestors)):
        name = str(n.get("Subplan Name", ""))
        if name.startswith("CTE "):
            return name[4:]
    return ""


def node_problems(label: str, node: Mapping[str, Any], part: str = "", text: str = ""
                  ) -> list[tuple[str, str]]:
    """The rules one plan node of statement ``label`` (CTE ``part``, statement text ``text``)
    breaks: (rule, why).

    A bitmap scan is judged as a whole on its Bitmap Heap Scan (the index it reads is below it,
    its conditions are the Recheck Cond); its Bitmap Index Scan is only counted."""
    rel = _relation(node)
    kind = str(node["Node Type"])
    if (rel == "claim_budgets" and label.startswith(("claim_fair", "give_ahead"))
            and kind != "ModifyTable"
            and not (kind in ("Index Scan", "Index Only Scan")
                     and re.search(r"\b(worker|tenant) = ", str(node.get("Index Cond", ""))))):
        # a claim reads its worker's slots ahead by key: (queue, worker) or (queue, tenant)
        return [("budgets-index", f"claim_budgets read by {kind}, not by its key")]
    if rel not in TABLES or kind == "ModifyTable":
        return []
    out: list[tuple[str, str]] = []
    if kind == "Bitmap Heap Scan":
        indexes = [str(n["Index Name"]) for n, _a in walk(node) if n["Node Type"] == "Bitmap Index Scan"]
        cond = str(node.get("Recheck Cond", ""))
    else:
        indexes = [str(node["Index Name"])] if "Index Name" in node else []
        cond = str(node.get("Index Cond", ""))
    filt = str(node.get("Filter", ""))
    by_tenant = bool(_TENANT_EQ.search(cond) or _TENANT_EQ.search(filt))
    via = ", ".join(indexes) or kind
    if kind == "Seq Scan":
        out.append(("seq-scan", f"Seq Scan on {rel}"))
    elif kind in ("Bitmap Index Scan", "Tid Scan", "Tid Range Scan"):
        pass
    elif "ctid" in cond + filt:
        out.append(("ctid-not-tid-scan", f"rows looked up by ctid through {via}, not a Tid Scan"))
    elif rel == "jobs":
        if "jobs_fifo_ready_idx" in indexes and label != "claim_fifo":
            out.append(("fifo-index", "jobs_fifo_ready_idx read outside claim_fifo"))
        if by_tenant:
            if indexes != ["jobs_tenant_ready_idx"]:
                out.append(("tenant-jobs-index",
                            f"a tenant's jobs read through {via}, not jobs_tenant_ready_idx"))
            if not _TENANT_EQ.search(cond):
                out.append(("tenant-not-in-index-cond", "the tenant is in the Filter, not the Index Cond"))
            if kind == "Bitmap Heap Scan":
                out.append(("tenant-jobs-bitmap", "a bitmap scan reads all of a tenant's jobs"))
        elif not set(indexes) <= {"jobs_pkey", "jobs_fifo_ready_idx"}:
            out.append(("jobs-index", f"jobs read through {via}, not by primary key"))
    elif by_tenant:  # tenant_schedule, looked up by tenant
        if indexes != ["tenant_schedule_pkey"]:
            out.append(("schedule-by-tenant-index",
                        f"a tenant's row read through {via}, not tenant_schedule_pkey"))
        if not _TENANT_EQ.search(cond):
            out.append(("tenant-not-in-index-cond", "the tenant is in the Filter, not the Index Cond"))
    else:  # tenant_schedule, a walk over a queue's tenants
        expected = ({"tenant_schedule_due_idx", "tenant_schedule_wake_idx"}
                    if part == "sleepers" or "wake_at" in cond + filt
                    else {"tenant_schedule_capped_idx"} if "running >= " in text
                    else {"tenant_schedule_runnable_idx"})
        if len(indexes) != 1 or indexes[0] not in expected:
            out.append(("walk-index", f"the walk reads {via}, not {' or '.join(sorted(expected))}"))
    touched = _touched(node)
    if touched > MAX_NODE_ROWS:
        out.append(("rows", f"touched {touched:g} rows (> {MAX_NODE_ROWS})"))
    filtered = float(node.get("Actual Loops", 0)) * float(node.get("Rows Removed by Filter", 0))
    if filtered > MAX_FILTERED:
        out.append(("filtered", f"removed {filtered:g} rows by its filter (> {MAX_FILTERED})"))
    return out


def plan_problems(logged: Logged) -> list[Problem]:
    out = []
    for node, anc in walk(logged.plan):
        part = _part(node, anc)
        out += [Problem(logged.label, part, rule, f"{why} [{describe(node)}]")
                for rule, why in node_problems(logged.label, node, part, logged.text)]
    return out


def _reads(logged: list[Logged], name: str, index: str) -> bool:
    """Whether statement ``name`` (or a statement of function ``name``) ran and really read
    ``index`` (an executed scan of it)."""
    return any(n.get("Index Name") == index and float(n.get("Actual Loops", 0)) > 0
               for x in logged if name in (x.label, x.function) for n, _a in walk(x.plan))


# -- cases ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    name: str
    statement: str
    queue: str = QUEUE
    policy: str = "weighted"
    returned: int = BATCH
    served: tuple[str, ...] = ()              # tenants the returned jobs must include
    functions: tuple[str, ...] = ()           # engine functions whose statements must run
    reads: tuple[tuple[str, str], ...] = ()   # (statement or function, index) it must read
    finish_after_claim: bool = False
    hold_queue: bool = False
    hold_row: str = ""                        # a tenant whose schedule row another session holds
    setup: tuple[str, ...] = ()               # run first, in the case's transaction


FINISHES = ("finish_done", "finish_failed", "release_unstarted", "extend_leases")
_FAIR_READS = (("claim_fair", "tenant_schedule_runnable_idx"), ("claim_fair", "jobs_tenant_ready_idx"))
CASES = (
    # A full claim: the sleepers first (woken at queue_vtime), then the walk from the whale.
    *(Case(f"claim_fair/{p}", "claim_fair", policy=p, served=(WHALE, *SLEEPERS),
           functions=("claim_fair", "queue_vtime", "claim_settle"), reads=_FAIR_READS)
      for p in ("round_robin", "weighted", "drr", "time")),
    # Every due job held by another transaction: nothing is taken; the claim asks wait_and_pick
    # for the tenants to wait for (in its own statement when it holds no lock, else in a second
    # statement with `wait`, as the Store), which tries each in turn and finds nothing to pick.
    Case("claim_fair/held", "claim_fair", queue=HELD, returned=0, hold_queue=True,
         functions=("wait_and_pick", "claim_settle"),
         reads=(("claim_fair", "tenant_schedule_runnable_idx"),
                ("wait_and_pick", "jobs_tenant_ready_idx"))),
    # Slots counted ahead (decision 015): a worker whose walk found its tenant's row held starts
    # jobs from them; a claim that serves that tenant counts more.
    Case("claim_fair/ahead", "claim_fair", hold_row=WHALE, served=(WHALE,),
         setup=ALONE_SETUP + AHEAD_SETUP, functions=("claim_fair",),
         reads=(("claim_fair", "jobs_tenant_ready_idx"),)),
    Case("claim_fair/topup", "claim_fair", served=(WHALE,),
         setup=ALONE_SETUP + TOPUP_SETUP + AHEAD_SETUP,
         functions=("claim_fair", "claim_settle", "give_ahead"),
         reads=(*_FAIR_READS, ("give_ahead", "tenant_schedule_runnable_idx"))),
    Case("claim_fifo", "claim_fifo", policy="fifo",
         reads=(("claim_fifo", "jobs_fifo_ready_idx"), ("claim_fifo", "tenant_schedule_pkey"))),
    # Finishes of the jobs a fair claim took just before (the sleepers' among them, whose tenants
    # claim_settle retired: release_unstarted wakes them at queue_vtime).
    # Their tenants' rows are written by return_slots, one statement per tenant.
    *(Case(s, s, finish_after_claim=True,
           reads=((s, "jobs_pkey"),) + ((("return_slots", "tenant_schedule_pkey"),)
                                        if s != "extend_leases" else ()),
           functions=(("return_slots", "queue_vtime") if s == "release_unstarted"
                      else ("return_slots",) if s != "extend_leases" else ()))
      for s in FINISHES),
    # queue_vtime on a queue whose every tenant is capped (its second query) and wait_and_pick
    # directly on a queue with jobs to pick (the held claim's finds none; here it takes the row
    # and asks whether a due job is left after the last one it took).
    # A finish that finds its tenant's row held leaves its slot in slot_returns.
    Case("returns", "returns", returned=1, hold_row=WHALE,
         functions=("return_slots",)),
    Case("functions", "functions", returned=1, setup=RETURNS_SETUP,
         functions=("queue_vtime", "wait_and_pick", "fold_capped", "fold_returns",
                    "settle_capped", "fold_stale_returns", "tenant_running", "return_budgets"),
         reads=(("wait_and_pick", "jobs_tenant_ready_idx"),
                ("queue_vtime", "tenant_schedule_capped_idx"))),
)
CASE = {c.name: c for c in CASES}


@dataclass
class Outcome:
    rows: list[Any]
    logged: list[Logged]
    ids: list[int] = field(default_factory=list)  # the jobs a finish case finished
    functions: frozenset[str] = frozenset()       # the engine functions the database has


AUTO_EXPLAIN = {"log_min_duration": "0", "log_analyze": "on", "log_nested_statements": "on",
                "log_format": "json", "log_level": "notice", "log_timing": "off",
                "log_verbose": "on"}


@contextmanager
def session(dsn: str, mode: str, extra: Mapping[str, str] | None = None
            ) -> Iterator[tuple[psycopg.Connection[Any], list[str], dict[str, str]]]:
    """A session with fairq's planner settings, ``mode`` plans forced, and auto_explain sending
    every plan (nested ones too) as a notice, collected in the list; and the engine's functions
    (``function_sources``), read before auto_explain is on."""
    options = (f"{planner_options()} -c plan_cache_mode=force_{mode}_plan "
               "-c lock_timeout=5000 -c statement_timeout=60000")
    options += "".join(f" -c {k}={v}" for k, v in (extra or {}).items())
    notices: list[str] = []
    with psycopg.connect(dsn, autocommit=True, options=options) as conn:
        sources = function_sources(conn)
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        conn.execute("LOAD 'auto_explain'")
        for key, value in AUTO_EXPLAIN.items():
            conn.execute(f"SET auto_explain.{key} = {value}")
        conn.execute("SET client_min_messages = notice")
        yield conn, notices, sources


@contextmanager
def holding(dsn: str, queue: str) -> Iterator[None]:
    """Another transaction holds the queue's jobs locked (FOR UPDATE) meanwhile."""
    with psycopg.connect(dsn) as other:
        other.execute(f"SELECT id FROM {SCHEMA}.jobs WHERE queue = %s FOR UPDATE", (queue,))
        try:
            yield
        finally:
            other.rollback()


def claim_rows(conn: psycopg.Connection[Any], policy: str, queue: str) -> list[Any]:
    """A claim as the Store makes it (fairq/store/pg.py): the statement, and when it returned
    its row of NULLs (it took nothing while it held a lock) under a policy that waits, the same
    statement again with ``wait``."""
    pol = get_policy(policy)
    params = pol.claim_params(queue=queue, batch=BATCH, worker="plan-states")
    text = sql.statement(pol.statement, SCHEMA)
    rows = conn.execute(text, params, prepare=True).fetchall()
    if rows and rows[0][0] is None and getattr(pol, "waits", False):
        rows = conn.execute(text, {**params, "wait": True}, prepare=True).fetchall()
    return rows


def run_case(dsn: str, case: Case, mode: str, extra: Mapping[str, str] | None = None,
             setup: Sequence[str] = ()) -> Outcome:
    """Run ``case`` in a transaction that is rolled back; the plans of its statement (and of the
    functions' statements) as auto_explain reported them. ``setup`` runs first, in the same
    transaction."""
    with session(dsn, mode, extra) as (conn, notices, sources), conn.transaction(force_rollback=True):
        for command in (*case.setup, *setup):
            conn.execute(command)
        ids: list[int] = []
        if case.finish_after_claim:
            claimed = claim_rows(conn, "weighted", QUEUE)
            assert len(claimed) == BATCH
            ids = [r[0] for r in claimed]
            text = sql.statement(case.statement, SCHEMA)
            values = {"ids": ids, "attempts": [r[5] for r in claimed], "errors": ["boom"] * len(ids),
                      "retry_delays": [None] * len(ids), "seconds": None,
                      "results": ['{"rows": 7}'] * len(ids), "notes": [None] * len(ids), "final": [],
                      "run_seconds": [0.01] * len(ids), "started": [r[11] for r in claimed]}
            params = {k: v for k, v in values.items() if f"%({k})s" in text}
        with (holding(dsn, case.queue) if case.hold_queue
              else holding_row(dsn, case.hold_row, SCHEMA) if case.hold_row else nullcontext()):
            notices.clear()
            if case.statement == "returns":
                rows = conn.execute(RETURNS_SQL, {"queue": QUEUE}, prepare=True).fetchall()
            elif case.statement == "functions":
                rows = conn.execute(FUNCTIONS_SQL, {"capped": CAPPED, "queue": QUEUE},
                                    prepare=True).fetchall()
            elif case.finish_after_claim:
                rows = conn.execute(text, params, prepare=True).fetchall()
            else:
                rows = claim_rows(conn, case.policy, case.queue)
            # A plain SELECT's executor ends when its portal is dropped: by the next statement.
            conn.execute(END_MARK)
        logged = [x for x in (parse_notice(n, sources) for n in list(notices)) if x is not None]
    return Outcome(rows, [x for x in logged if x.text != END_MARK], ids, frozenset(sources))


def case_problems(case: Case, mode: str, out: Outcome) -> list[Problem]:
    labels = [x.label for x in out.logged]
    top = [x for x in out.logged if x.label == case.statement]
    if not top:
        return [Problem(case.statement, "", "plans", f"no plan of it among {labels}")]
    problems: list[Problem] = []
    if len(out.rows) != case.returned:
        problems.append(Problem(case.statement, "", "returned",
                                f"returned {len(out.rows)} rows, expected {case.returned}"))
    if case.served and not set(case.served) <= {r[2] for r in out.rows}:
        problems.append(Problem(case.statement, "", "served",
                                f"served {sorted({r[2] for r in out.rows})}, not all of {case.served}"))
    # The plan mode is the one asked for. The values are literals in a custom plan and nowhere in
    # a generic one; a function's statements compare the queue to a literal or to $n.
    # A queue's literal counts where a queue is compared or passed to a function, not after a
    # comma: 'default' is also the default group's name (claim_fair's group lookup).
    literals = [re.escape(f"'{q}'::text") for q in (QUEUE, HELD, CAPPED)]
    if out.ids:
        literals.append(re.escape("'{" + ",".join(map(str, out.ids)) + "}'::bigint[]"))
    custom = re.compile(r"(?<!, )(?:" + "|".join(literals) + ")")
    for x in out.logged:
        text = json.dumps(x.plan)
        got = {m for m, hit in (("generic", re.search(r"\bqueue = \$\d", text)),
                                ("custom", custom.search(text))) if hit}
        if x in top and not got:
            got = {"generic"}  # no value anywhere: they are parameters
        if got - {mode}:
            problems.append(Problem(x.label, "", "mode", f"asked for a {mode} plan, got another"))
    ran = {x.function for x in out.logged}
    problems += [Problem(f, "", "not-run", f"no statement of {f} ran (ran: {labels})")
                 for f in case.functions if f in out.functions and f not in ran]
    problems += [Problem(name, "", "not-read", f"did not read {index}")
                 for name, index in case.reads if not _reads(out.logged, name, index)]
    problems += [Problem(x.label, "", "unknown-statement", x.text[:200])
                 for x in out.logged if x.label.startswith("other:")]
    for x in out.logged:
        problems += plan_problems(x)
    return problems


# -- known defects --------------------------------------------------------------------------
@dataclass(frozen=True)
class Defect:
    summary: str       # the xfail reason
    description: str
    matches: Callable[[Problem], bool]


_SUSPECTS = "claim_settle: suspects := suspects || array("
DEFECTS = {
    "head-lookup": Defect(
        "the wait locks the tenant it waits for through tenant_schedule_runnable_idx with the "
        "tenant as a non-leading column, not by tenant_schedule_pkey",
        "wait_and_pick, `SELECT ts.ctid, ... FROM tenant_schedule ts WHERE ts.queue = q AND "
        "ts.tenant = t FOR NO KEY UPDATE OF ts` with a condition on active or running added: "
        "Index Scan of tenant_schedule_runnable_idx (queue, vtime, tenant), Index Cond ((queue = $1) "
        "AND (tenant = $10)): vtime comes first, so each lookup reads every runnable entry of the "
        "queue; never tenant_schedule_pkey. Planned so while tenant_schedule is small (~300 rows).",
        lambda p: p.statement.startswith("wait_and_pick:") and p.rule == "schedule-by-tenant-index"),
    "settle-wake-scan": Defect(
        "claim_settle wakes the claim's sleepers by a full scan of an index of idle tenants "
        "(tenant_schedule_due_idx or _wake_idx: every idle tenant of every queue) with ctid = ANY "
        "in a Filter, not a Tid Scan",
        "claim_settle, `UPDATE tenant_schedule ts SET active = true, wake_at = NULL, "
        "vtime = v WHERE ts.ctid = ANY (sleeper_rows) AND NOT ts.active`: Index Scan of "
        "tenant_schedule_due_idx (or tenant_schedule_wake_idx) with no Index Cond, Filter ((NOT "
        "active) AND (ctid = ANY ($11))): the partial index of idle tenants is read whole (200 rows "
        "here), in every fair claim, sleepers or not.",
        lambda p: (p.statement.startswith("claim_settle:") and p.rule == "ctid-not-tid-scan")
        or (p.statement.startswith("claim_settle:") and p.rule in ("rows", "filtered")
            and "Index Name: tenant_schedule_pkey" not in p.detail)),
    "fifo-tenants-filter": Defect(
        "claim_fifo reads every tenant row of the queue (tenant = ANY in a Filter of "
        "tenant_schedule_pkey) to lock and update its batch's tenants",
        "claim_fifo, CTEs locked and upd_tenants: `ts.tenant = ANY (array of the picked jobs' "
        "tenants)` is a Filter on an Index Scan of tenant_schedule_pkey whose Index Cond is "
        "(queue = $1) alone: every tenant row of the queue is read (303 here) to lock and update "
        "the few tenants of a batch",
        lambda p: p.statement == "claim_fifo" and p.part in ("locked", "upd_tenants")
        and p.rule in ("tenant-not-in-index-cond", "rows", "filtered")),
    "settle-stop-pkey": Defect(
        "claim_settle finds the runnable tenants at the stop's vtime before the stop's tenant "
        "through tenant_schedule_pkey (every tenant before it, vtime in a Filter), not the "
        "runnable index, when tenant_schedule's statistics say it holds one row",
        "analyzed_one_tenant (one tenant's jobs, ANALYZE, then hundreds of tenants): claim_settle, "
        "a read of the tenants at the stop's vtime before the stop's tenant (`ts.vtime = "
        "stop_vtime AND ts.tenant < stop_tenant ORDER BY ts.tenant LIMIT 1000`): both indexes give "
        "the tenant order (vtime is fixed), and the planner takes the primary key: Index Cond "
        "((queue = $1) AND (tenant < $5)), Filter (... vtime = $4), 202 rows removed. It lasts "
        "until tenant_schedule's row count is renewed (a VACUUM). claim_settle reads one range "
        "`(vtime, tenant) < (stop_vtime, stop_tenant)` backwards from the stop instead (a forward "
        "read of it does not end at the stop on 15; ordering by (vtime, tenant) with `vtime = "
        "stop_vtime` does not help, as the equality makes that key redundant to the planner).",
        lambda p: p.statement.startswith(_SUSPECTS) and p.rule in ("walk-index", "rows", "filtered")),
}


class KnownDefects(AssertionError):
    """The problems found are catalogued defects this case is known to have."""


_FAIR = ("claim_fair/round_robin", "claim_fair/weighted", "claim_fair/drr", "claim_fair/time")
_ALL, _GENERIC = MODES, ("generic",)
_ANALYZED = ("analyzed_empty", "analyzed_before_bulk", "skewed", "fresh")


def _expand(*entries: tuple[str, Sequence[str], Sequence[str], Sequence[str]]
            ) -> dict[tuple[str, str, str], frozenset[str]]:
    """(defect, states, cases, modes) entries -> (state, case, mode) -> defects."""
    out: dict[tuple[str, str, str], frozenset[str]] = {}
    for defect, states_, cases, modes in entries:
        for key in ((s, c, m) for s in states_ for c in cases for m in modes):
            out[key] = out.get(key, frozenset()) | {defect}
    return out


# Server major version -> (state, case, mode) -> the defects seen there. None is seen today (the
# wait and claim_fifo lock by the key alone, claim_settle writes by ctid alone and reads the
# tenants before a stop in one range backwards from it); the catalogue names a regression when
# one comes back.
KNOWN: dict[int, dict[tuple[str, str, str], frozenset[str]]] = {}


def classify(problems: Sequence[Problem]) -> tuple[set[str], list[Problem]]:
    """The catalogued defects among ``problems``, and the problems no defect describes."""
    found: set[str] = set()
    unknown = []
    for p in problems:
        ids = [d for d, defect in DEFECTS.items() if defect.matches(p)]
        found.update(ids)
        if not ids:
            unknown.append(p)
    return found, unknown


def _params() -> list[Any]:
    return [pytest.param(state, case, mode, id=f"{state}-{case.name}-{mode}")
            for state in STATES for case in CASES for mode in MODES]


@pytest.mark.parametrize(("state", "case", "mode"), _params())
def test_plan_holds(states: States, request: pytest.FixtureRequest, state: str, case: Case,
                    mode: str) -> None:
    expected = KNOWN.get(states.server, {}).get((state, case.name, mode), frozenset())
    if expected:
        request.applymarker(pytest.mark.xfail(
            strict=True, raises=KnownDefects,
            reason=f"PostgreSQL {states.server}: " + "; ".join(
                f"{d}: {DEFECTS[d].summary}" for d in sorted(expected))))
    out = run_case(states.dsn(state), case, mode)
    problems = case_problems(case, mode, out)
    found, unknown = classify(problems)
    plans = "\n".join(f"{x.label}:\n{plan_tree(x)}" for x in out.logged
                      if any(p.statement == x.label for p in problems))
    listed = "\n".join(map(str, problems))
    assert not unknown and found <= expected, (
        f"not known here: {sorted(found - expected)}\n{listed}\n{plans}")
    if found:
        raise KnownDefects(f"{sorted(found)}\n{listed}")


def test_every_function_statement_is_checked(states: States) -> None:
    """The cases run every statement of every engine function (so each plan above is checked):
    the fair claims, the held claim (its short walk, wait_and_pick), release_unstarted and the
    direct calls (queue_vtime's capped query, wait_and_pick with jobs to pick, claim_settle's
    reads of a stop and of a reach, which no claim passes today) between them. A logged query
    counts, not a bare expression: a bare name is text of every body that names it, and once
    made claim_settle's reach read look run when nothing ran it."""
    dsn = states.dsn("fresh")
    with psycopg.connect(dsn) as conn:
        sources = function_sources(conn)
    seen: dict[str, set[str]] = {}
    for case in CASES:
        for x in run_case(dsn, case, "generic").logged:
            if x.function:
                # Every function with this statement. Queries only: a bare expression is in
                # every body that names it.
                for f, src in sources.items():
                    if _QUERY.search(x.text) and normal(x.text) in as_run(src):
                        seen.setdefault(f, set()).add(normal(x.text))
    assert set(sources) == set(ENGINE_FUNCTIONS), sources.keys()
    missing = [f"{f}: {stmt[:160]}" for f, body in sources.items() for stmt in function_statements(body)
               if not any(text in as_run(stmt) for text in seen.get(f, ()))]
    assert missing == [], "\n".join(missing)


# -- the guards' own checks ------------------------------------------------------------------
def _node(kind: str, **fields: Any) -> dict[str, Any]:
    return {"Node Type": kind, "Actual Rows": 1, "Actual Loops": 1, **fields}


JOBS, SCHED = {"Relation Name": "jobs"}, {"Relation Name": "tenant_schedule"}
TRIPS = [  # (rule, statement label, CTE, node)
    ("seq-scan", "finish_done", "", _node("Seq Scan", **JOBS)),
    ("budgets-index", "claim_fair: SELECT b.tenant", "",
     _node("Seq Scan", **{"Relation Name": "claim_budgets"})),
    ("seq-scan", "claim_settle: SELECT array_agg(x.ctid)", "", _node("Seq Scan", **SCHED)),
    ("tenant-jobs-index", "claim_fair", "taken", _node(
        "Index Scan", **JOBS, **{"Index Name": "jobs_fifo_ready_idx", "Index Cond": "(queue = $1)",
                                 "Filter": "(tenant = c.tenant)"})),
    ("fifo-index", "claim_fair", "taken", _node(
        "Index Scan", **JOBS, **{"Index Name": "jobs_fifo_ready_idx", "Index Cond": "(queue = $1)"})),
    ("tenant-not-in-index-cond", "wait_and_pick", "", _node(
        "Index Only Scan", **JOBS, **{"Index Name": "jobs_tenant_ready_idx",
                                      "Index Cond": "(queue = $1)", "Filter": "(tenant = ts.tenant)"})),
    ("tenant-jobs-bitmap", "claim_settle: UPDATE", "", _node(
        "Bitmap Heap Scan", **JOBS, **{"Recheck Cond": "((queue = $1) AND (tenant = ts.tenant))",
                                       "Plans": [_node("Bitmap Index Scan", **{
                                           "Index Name": "jobs_tenant_ready_idx",
                                           "Index Cond": "((queue = $1) AND (tenant = ts.tenant))"})]})),
    ("jobs-index", "finish_done", "", _node(
        "Index Scan", **JOBS, **{"Index Name": "jobs_lease_idx", "Filter": "(status = 'running')"})),
    ("schedule-by-tenant-index", "claim_fair", "cand", _node(
        "Index Scan", **SCHED, **{"Index Name": "tenant_schedule_runnable_idx",
                                  "Index Cond": "((queue = $1) AND (tenant = hot.tenant))"})),
    ("tenant-not-in-index-cond", "claim_fifo", "locked", _node(
        "Index Scan", **SCHED, **{"Index Name": "tenant_schedule_pkey", "Index Cond": "(queue = $1)",
                                  "Filter": "(tenant = ANY ($5))"})),
    ("ctid-not-tid-scan", "claim_settle: UPDATE", "", _node(
        "Index Scan", **SCHED, **{"Index Name": "tenant_schedule_due_idx",
                                  "Filter": "((NOT active) AND (ctid = ANY ($11)))"})),
    ("walk-index", "claim_fair", "cand", _node(
        "Index Scan", **SCHED, **{"Index Name": "tenant_schedule_pkey", "Index Cond": "(queue = $1)"})),
    ("walk-index", "claim_fair", "sleepers", _node(
        "Index Scan", **SCHED, **{"Index Name": "tenant_schedule_runnable_idx",
                                  "Index Cond": "(queue = $1)"})),
    ("rows", "claim_fair", "taken", _node(
        "Index Scan", **JOBS, **{"Index Name": "jobs_tenant_ready_idx", "Actual Rows": 5000,
                                 "Index Cond": "((queue = $1) AND (tenant = c.tenant))"})),
    ("rows", "claim_fair", "suspects", _node(
        "Bitmap Index Scan", **{"Index Name": "tenant_schedule_runnable_idx", "Actual Rows": 101})),
    ("filtered", "claim_fair", "served", _node(
        "Index Only Scan", **JOBS, **{"Index Name": "jobs_tenant_ready_idx", "Actual Loops": 10,
                                      "Rows Removed by Filter": 2,
                                      "Index Cond": "((queue = $1) AND (tenant = t.tenant))"})),
]


@pytest.mark.parametrize(("rule", "label", "part", "node"), TRIPS,
                         ids=[f"{t[0]}-{t[1]}" for t in TRIPS])
def test_each_rule_trips(rule: str, label: str, part: str, node: dict[str, Any]) -> None:
    assert rule in [r for r, _why in node_problems(label, node, part)]


def test_the_rules_pass_good_nodes() -> None:
    """The plans the guards expect do not trip them."""
    good = [
        ("claim_fair", "taken", _node("Index Scan", **JOBS, **{
            "Index Name": "jobs_tenant_ready_idx", "Actual Loops": 10,
            "Index Cond": "((queue = $1) AND (tenant = c.tenant) AND (run_at <= now()))"})),
        ("claim_fair", "cand", _node("Index Scan", **SCHED, **{
            "Index Name": "tenant_schedule_runnable_idx", "Actual Rows": 8,
            "Index Cond": "((queue = $1) AND (vtime <= ($9 + $3)))"})),
        ("claim_fair", "sleepers", _node("Index Scan", **SCHED, **{
            "Index Name": "tenant_schedule_due_idx", "Index Cond": "((queue = $1) AND (wake_at <= now()))"})),
        ("claim_fifo", "picked", _node("Index Scan", **JOBS, **{
            "Index Name": "jobs_fifo_ready_idx", "Actual Rows": 10, "Index Cond": "(queue = $1)"})),
        ("claim_fifo", "locked", _node("Index Scan", **SCHED, **{
            "Index Name": "tenant_schedule_pkey",
            "Index Cond": "((queue = $1) AND (tenant = ANY ($5)))"})),
        ("claim_settle: UPDATE", "", _node("Tid Scan", **SCHED, **{
            "TID Cond": "(ctid = x.row_)", "Actual Loops": 10})),
        ("finish_done", "", _node("Index Scan", **JOBS, **{
            "Index Name": "jobs_pkey", "Actual Loops": 10, "Index Cond": "(id = i.id)"})),
    ]
    for label, part, node in good:
        assert node_problems(label, node, part) == [], (label, node)
    capped = _node("Index Only Scan", **SCHED, **{"Index Name": "tenant_schedule_capped_idx",
                                                  "Index Cond": "(queue = $1)"})
    text = "SELECT ts.vtime FROM fairq.tenant_schedule ts WHERE ts.queue = q AND ts.active AND "
    assert node_problems("queue_vtime: SELECT", capped, "", text + "ts.running >= ts.max_running") == []
    assert [r for r, _w in node_problems("queue_vtime: SELECT", capped, "",
                                         text + "ts.running < ts.max_running")] == ["walk-index"]


# Seq scans back on: with every scan type disabled the planner would still pick index scans.
NO_INDEX_SCANS = {"enable_indexscan": "off", "enable_indexonlyscan": "off", "enable_bitmapscan": "off",
                  "enable_seqscan": "on"}


@pytest.mark.parametrize("name", ["claim_fifo", "claim_fair/weighted", "finish_done"])
def test_guard_trips_without_index_scans(states: States, name: str) -> None:
    """With index scans disabled the statement, and the functions' statements it runs, read the
    tables by Seq Scan or by a full scan of an index: the guard sees it, in the top-level plan
    and in the nested ones alike, and no catalogued defect excuses it."""
    case = CASE[name]
    out = run_case(states.dsn("fresh"), case, "generic", extra=NO_INDEX_SCANS)
    problems = case_problems(case, "generic", out)
    tripped = {p.statement for p in problems if p.rule in ("seq-scan", "rows")}
    # claim_fair's statements run inside its function: "claim_fair: ..."
    assert any(t == case.statement or t.startswith(f"{case.statement}:") for t in tripped), problems
    if case.statement == "claim_fair":
        assert any(label.split(":")[0] in ENGINE_FUNCTIONS for label in tripped), problems
    assert any(p.rule == "seq-scan" for p in problems), problems
    assert classify(problems)[1], "the scans must not pass for a catalogued defect"


PICK = "claim_fair: ids := ARRAY(SELECT pj.id"  # weighted's pick


def test_guard_trips_on_the_old_fifo_index(states: States) -> None:
    """Why jobs_fifo_ready_idx's predicate says ``cost > 0``: with statistics never taken, the
    planner reads a tenant's jobs through an index of every queued job (status = 'queued'),
    filtering out every other tenant's jobs. With such an index (and the only index left to a
    tenant's jobs), the guard must see the whale's 5,000 jobs scanned past, in the claim and in
    claim_settle's probes."""
    setup = [f"CREATE INDEX jobs_fifo_ready_old ON {SCHEMA}.jobs (queue, priority DESC, run_at, id) "
             "WHERE status = 'queued'",
             f"DROP INDEX {SCHEMA}.jobs_tenant_ready_idx"]
    case = CASE["claim_fair/weighted"]
    for mode in MODES:
        out = run_case(states.dsn("never_analyzed"), case, mode, setup=setup)
        problems = case_problems(case, mode, out)
        keys = {p.key for p in problems}
        # claim_fair's pick of a tenant's jobs
        pick = [p for p in problems if p.statement.startswith(PICK)]
        assert {"tenant-jobs-index", "tenant-not-in-index-cond", "rows", "filtered"} <= {
            p.rule for p in pick}, (mode, keys)
        assert any(p.statement.startswith("claim_settle:") and p.rule == "tenant-not-in-index-cond"
                   for p in problems), (mode, keys)
        rows = [p for p in pick if p.rule == "rows"]
        assert "jobs_fifo_ready_old" in rows[0].detail, rows


# -- a queue one tenant owns --------------------------------------------------------------------
# The states above hold 300 tenants, so a generic plan puts a tenant's share of the jobs at 1/300
# of the table. On a queue of one tenant (one customer, or a benchmark of one) the estimate is
# the whole table, and a statement with no order to keep ("is a due job left after this one?")
# looks cheapest as a Seq Scan expecting a match in its first rows. fairq's sessions turn Seq
# Scans off (PLANNER_SETTINGS, fairq/store/planner.py), so its plans keep the index; without that
# setting the generic plan of "is a due job left after the last one taken" is a Seq Scan, over
# the claimed and finished jobs first in the heap.
SOLO = "solo"


def _one_tenant_state(dsn: str) -> None:
    _tables(dsn, "ALTER TABLE {} SET (autovacuum_enabled = false)")
    with App(dsn, schema=SCHEMA) as app:
        app.store.set_tenants([TenantConfig(SOLO, 2.0, 1_000)])
        app.enqueue_many("plan", [(SOLO, None)] * 3_000)
        app.enqueue_many("plan", [(SOLO, None)] * 1_000, priority=-1)  # a lower priority too
    _tables(dsn, "ANALYZE {}")


@pytest.fixture(scope="module")
def one_tenant(admin_dsn: str, template_db: str) -> Iterator[str]:
    name = create_database(admin_dsn, "fairq_pstate", template=template_db)
    try:
        dsn = dsn_for_db(admin_dsn, name)
        _one_tenant_state(dsn)
        yield dsn
    finally:
        drop_database(admin_dsn, name)


def one_tenant_problems(dsn: str, mode: str, extra: Mapping[str, str] | None = None
                        ) -> list[Problem]:
    """Every fair policy's claim (its walk cut short by the batch: claim_fair asks for a job
    after the last one taken), fifo's claim and wait_and_pick directly (it asks the same after
    its wait), in one rolled-back transaction: the guards on every plan, nested ones too."""
    problems: list[Problem] = []
    ran: set[str] = set()
    with session(dsn, mode, extra) as (conn, notices, sources), \
            conn.transaction(force_rollback=True):
        for policy in ("round_robin", "weighted", "drr", "fifo"):
            rows = claim_rows(conn, policy, QUEUE)
            assert len(rows) == BATCH, (policy, len(rows))
        picked = conn.execute(f"SELECT count(*) FROM {SCHEMA}.wait_and_pick(%(queue)s, 3, true, true, false)",
                              {"queue": QUEUE}, prepare=True).fetchone()
        assert picked is not None and picked[0] == 3
        conn.execute(END_MARK)
        for x in (parse_notice(n, sources) for n in list(notices)):
            if x is not None and x.text != END_MARK:
                ran.add(x.function or x.label)
                problems += plan_problems(x)
    assert {"claim_fair", "claim_fifo", "wait_and_pick", "claim_settle"} <= ran, ran
    return problems


@pytest.mark.parametrize("mode", MODES)
def test_plans_hold_when_one_tenant_owns_every_job(one_tenant: str, mode: str) -> None:
    problems = one_tenant_problems(one_tenant, mode)
    assert problems == [], "\n".join(map(str, problems))


def test_one_tenant_needs_the_session_settings(one_tenant: str) -> None:
    """The state is one where the settings matter: with Seq Scans allowed, the generic plan of
    claim_fair's check for a due job after the last one taken reads the whole jobs table."""
    problems = one_tenant_problems(one_tenant, "generic", {"enable_seqscan": "on"})
    assert any(p.statement.startswith("claim_fair: more :=") and p.rule == "seq-scan"
               for p in problems), "\n".join(map(str, problems))


# -- the enqueue ----------------------------------------------------------------------------------
@pytest.mark.parametrize("tasks", ["ARRAY['plan', 'plan']", "ARRAY['plan']"],
                         ids=["general", "shared_shape"])
@pytest.mark.parametrize("state", ["fresh", "analyzed_one_tenant"])
@pytest.mark.parametrize("mode", MODES)
def test_the_enqueue_reads_only_its_tenants(states: States, state: str, mode: str,
                                            tasks: str) -> None:
    """A job for a busy tenant and one for a new tenant, through the SQL enqueue, in fairq's
    session settings (sorts off among them): no statement of it reads tenant_schedule beyond
    the chunk's tenants and the queue's first (the guards' row bounds; no Seq Scan), among
    hundreds of tenants. A lock of the chunk's tenants by a join ordered by tenant_schedule's
    key reads every tenant by primary key with sorts off; enqueue_many locks each by its key.
    In analyzed_one_tenant queue_vtime, for the new tenant, reads the whole queue with sorts
    on. One task a job takes the general path; one task for both, App.enqueue_many's shape."""
    problems: list[Problem] = []
    with session(states.dsn(state), mode) as (conn, notices, sources), \
            conn.transaction(force_rollback=True):
        conn.execute(f"SELECT {SCHEMA}.enqueue_many(tasks => {tasks}, "
                     f"tenants => ARRAY[%s, 'newcomer'], queues => ARRAY[%s])",
                     (WHALE, QUEUE), prepare=True)
        conn.execute(END_MARK)
        logged = [x for x in (parse_notice(n, sources) for n in list(notices))
                  if x is not None and x.text != END_MARK]
    assert any("tenant_schedule" in x.text for x in logged), [x.label for x in logged]
    for x in logged:
        for node, anc in walk(x.plan):
            if _relation(node) != "tenant_schedule":
                continue
            part = _part(node, anc)
            problems += [Problem(x.label, part, rule, f"{why} [{describe(node)}]")
                         for rule, why in node_problems(x.label, node, part, x.text)
                         if rule in ("seq-scan", "rows", "filtered")]
    assert problems == [], "\n".join(map(str, problems))
