"""EXPLAIN tooling for the claim statements: a set-based loader, custom and generic plans of
the very statement psycopg prepares, and a summary of what each plan touched.

Shared by ``tests/integration/test_claim_plans.py`` (the guard) and ``benchmarks/claim_bench.py``; run it
directly to print the summaries (and, with ``--json``, the raw plans) for one database size:

    python -m benchmarks.claim_plans --tenants 100000 --finished 200000 [--dsn URL]

Why EXPLAIN EXECUTE of a prepared statement rather than EXPLAIN of the text: EXPLAIN of a
statement sent with bound parameters is always planned with the values known (a custom plan),
whatever ``plan_cache_mode`` says. psycopg's prepared statements go through the plan cache, where
after five executions PostgreSQL may switch to a generic plan, with ``$n`` in place of the
values. Only ``EXPLAIN EXECUTE`` of the statement psycopg prepared shows that plan.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import sys
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from fairq import sql as fsql
from fairq.policies import POLICIES

SCHEMA = "fairq"
QUEUE = "default"
NO_QUEUE = "__claim_plans_nothing__"
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")

# (label, policy name, statement name): every claim statement, with each fair policy's parameters.
CASES: tuple[tuple[str, str, str], ...] = (
    ("claim_fair/round_robin", "round_robin", "claim_fair"),
    ("claim_fair/weighted", "weighted", "claim_fair"),
    ("claim_fair/drr", "drr", "claim_fair"),
    ("claim_fifo/fifo", "fifo", "claim_fifo"),
)


def with_db(dsn: str, name: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = name
    return make_conninfo(**params)  # type: ignore[arg-type]


def create_db(admin_dsn: str, prefix: str = "fairq_bench") -> str:
    name = f"{prefix}_{secrets.token_hex(5)}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    return name


def drop_db(admin_dsn: str, name: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))


# -- loading ------------------------------------------------------------------------------
def load(dsn: str, *, tenants: int, queued_per_tenant: int, finished: int,
         queue: str = QUEUE, schema: str = SCHEMA, max_running: int = 1000) -> None:
    """Fill a migrated schema with set-based SQL (seconds, not minutes, for 10^5..10^6 rows).

    Finished jobs come first (lower ids, as in a queue that has run for a while), then the
    queued jobs interleaved over tenants, so FIFO order also round-robins the tenants. Weights
    vary (1..4) and costs vary (1..3) so weighted and drr take their real arithmetic paths.
    Ends with VACUUM ANALYZE: the state autovacuum leaves behind.
    """
    s = pgsql.Identifier(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(pgsql.SQL("""
            INSERT INTO {s}.tenant_schedule (queue, tenant, weight, max_running, vtime, active)
            SELECT %(q)s, 't' || g, 1 + g %% 4, %(cap)s, 0, true FROM generate_series(1, %(n)s) g
            ON CONFLICT DO NOTHING""").format(s=s), {"q": queue, "n": tenants, "cap": max_running})
        if finished:
            conn.execute(pgsql.SQL("""
                INSERT INTO {s}.jobs (queue, tenant, task, status, attempts, run_at, started_at,
                                      finished_at, created_at)
                SELECT %(q)s, 't' || (1 + g %% %(n)s), 'bench', 'done', 1,
                       now() - interval '2 hours', now() - interval '2 hours',
                       now() - interval '1 hour', now() - interval '2 hours'
                FROM generate_series(1, %(f)s) g""").format(s=s),
                {"q": queue, "n": tenants, "f": finished})
        if queued_per_tenant:
            conn.execute(pgsql.SQL("""
                INSERT INTO {s}.jobs (queue, tenant, task, cost, run_at)
                SELECT %(q)s, 't' || t, 'bench', 1 + (t + k) %% 3, now() - interval '1 minute'
                FROM generate_series(1, %(k)s) k, generate_series(1, %(n)s) t
                ORDER BY k, t""").format(s=s), {"q": queue, "n": tenants, "k": queued_per_tenant})
        conn.execute(pgsql.SQL("VACUUM ANALYZE {s}.jobs").format(s=s))
        conn.execute(pgsql.SQL("VACUUM ANALYZE {s}.tenant_schedule").format(s=s))


# -- prepared statements and EXPLAIN ------------------------------------------------------
def to_dollar(text: str) -> tuple[str, list[str]]:
    """The text psycopg sends for ``%(name)s`` placeholders: ``$n`` by first appearance."""
    order: list[str] = []

    def sub(m: re.Match[str]) -> str:
        if m.group(1) not in order:
            order.append(m.group(1))
        return f"${order.index(m.group(1)) + 1}"

    return _PLACEHOLDER.sub(sub, text), order


def params_for(policy: str, *, batch: int, queue: str = QUEUE) -> dict[str, Any]:
    return POLICIES[policy].claim_params(queue=queue, batch=batch, worker="explain")


def prepare_like_psycopg(conn: psycopg.Connection[Any], text: str, params: Mapping[str, Any]
                         ) -> tuple[str, list[str], list[str]]:
    """Have psycopg itself prepare ``text`` (extended protocol) and return its server-side name,
    parameter types and parameter names.

    The preparing execution runs for a queue that does not exist, so it changes nothing: a
    rollback is no option, as psycopg deallocates its prepared statements on any rollback.
    The parameter types are the same as for the real queue (the queue is an untyped string).
    """
    dollar, order = to_dollar(text)
    conn.execute(text, {**params, "queue": NO_QUEUE}, prepare=True)
    row = conn.execute(
        "SELECT name, parameter_types::text[] FROM pg_prepared_statements WHERE statement = %s",
        (dollar,)).fetchone()
    if row is None:
        raise RuntimeError("psycopg did not prepare the statement (or its $n text differs)")
    return row[0], list(row[1]), order


@dataclass
class PlanSummary:
    """What one EXPLAIN (ANALYZE, BUFFERS) of a claim touched."""

    mode: str                      # custom | generic
    returned: int                  # rows the statement returned (jobs claimed)
    planning_ms: float
    execution_ms: float
    buffers: int                   # shared hit + read, execution (incl. deferred CTE updates)
    planning_buffers: int
    rows_touched: int              # rows produced or filtered out by scans of jobs/tenant_schedule
    generic: bool                  # the queue is a $n in the plan, not the literal: generic plan
    seq_scans: list[str] = field(default_factory=list)      # relations read by Seq Scan
    index_scans: dict[str, int] = field(default_factory=dict)  # index -> rows touched
    limited_indexes: list[str] = field(default_factory=list)   # index scans under a Limit


def nodes(plan: Mapping[str, Any], ancestors: tuple[str, ...] = ()
          ) -> Iterator[tuple[Mapping[str, Any], tuple[str, ...]]]:
    """Every plan node with the node types above it."""
    yield plan, ancestors
    for child in plan.get("Plans", []):
        yield from nodes(child, (*ancestors, plan["Node Type"]))


def _bufs(node: Mapping[str, Any]) -> int:
    return int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0))


def summarise(explain: Mapping[str, Any], mode: str, queue: str = QUEUE, queue_param: int = 1
              ) -> PlanSummary:
    """Reduce an EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) document to what the guard checks.

    Generic or custom is read from the plan itself: ``queue = $n`` in a condition (generic) or
    the queue's literal (custom). A bare ``$n`` proves nothing: PostgreSQL 15 prints InitPlan
    outputs as ``$0``, ``$1``... too.
    """
    top = explain["Plan"]
    text = json.dumps(explain)  # with the nested plans: claim_fair's own conditions are there
    literal = "'" + queue.replace("'", "''") + "'::text"
    # A data-modifying CTE nobody reads (upd_tenants) runs after the main plan finished, outside
    # the top node's counters: add it. (A read one would be counted twice: an upper bound.)
    deferred = sum(_bufs(n) for n, anc in nodes(top) if anc and n["Node Type"] == "ModifyTable")
    s = PlanSummary(
        mode=mode,
        returned=int(top.get("Actual Rows", 0)),
        planning_ms=float(explain.get("Planning Time", 0.0)),
        execution_ms=float(explain.get("Execution Time", 0.0)),
        buffers=_bufs(top) + deferred,
        planning_buffers=_bufs(explain.get("Planning", {})),
        rows_touched=0,
        # The queue's literal in a condition on a queue column; a literal elsewhere (the
        # default group's name, 'default', in claim_fair's group lookup) is not evidence.
        generic=f"queue = ${queue_param})" in text and f"queue = {literal}" not in text,
    )
    # The statements functions ran (claim_fair, claim_settle) are read like the statement's own
    # nodes; their buffers are in the top node's already.
    every = [x for plan in (top, *explain.get("Nested Plans", [])) for x in nodes(plan)]
    for n, anc in every:
        rel = n.get("Relation Name")
        if rel not in ("jobs", "tenant_schedule"):
            continue
        loops = int(n.get("Actual Loops", 1))
        touched = loops * int(n.get("Actual Rows", 0) + n.get("Rows Removed by Filter", 0)
                              + n.get("Rows Removed by Index Recheck", 0))
        if n["Node Type"] in ("Seq Scan", "Bitmap Heap Scan"):
            s.seq_scans.append(f"{n['Node Type']} on {rel}")
        if "Index Name" in n and n["Node Type"] != "ModifyTable":
            idx = n["Index Name"]
            s.index_scans[idx] = s.index_scans.get(idx, 0) + touched
            if "Limit" in anc:
                s.limited_indexes.append(idx)
        if n["Node Type"] != "ModifyTable":
            s.rows_touched += touched
    return s


def explain_prepared(conn: psycopg.Connection[Any], name: str, types: list[str], order: list[str],
                     params: Mapping[str, Any], mode: str, settings: Mapping[str, str] | None = None
                     ) -> tuple[dict[str, Any], PlanSummary]:
    """EXPLAIN (ANALYZE, BUFFERS) EXECUTE a prepared claim under a forced plan mode, rolled back.

    ``settings`` are extra planner settings for this transaction only (the guard's self-test).
    """
    args = pgsql.SQL(", ").join(
        pgsql.SQL("{}::{}").format(pgsql.Literal(params[n]), pgsql.SQL(t))
        for n, t in zip(order, types, strict=True))
    stmt = pgsql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE {}({})").format(
        pgsql.Identifier(name), args)
    notices: list[str] = []

    def collect(d: psycopg.errors.Diagnostic) -> None:
        notices.append(d.message_primary or "")

    with conn.transaction(force_rollback=True):
        conn.execute("SELECT set_config('plan_cache_mode', %s, true)", (f"force_{mode}_plan",))
        for key, value in (settings or {}).items():
            conn.execute("SELECT set_config(%s, %s, true)", (key, value))
        # The statements a function runs (claim_fair's, claim_settle's) are not in the EXPLAIN
        # of the statement that calls it: auto_explain reports them, as notices.
        conn.execute("LOAD 'auto_explain'")
        for key, value in NESTED_EXPLAIN.items():
            conn.execute("SELECT set_config(%s, %s, true)", (f"auto_explain.{key}", value))
        conn.add_notice_handler(collect)
        try:
            row = conn.execute(stmt).fetchone()
            if mode == "generic":
                # The first EXECUTE built the generic plan; the second shows the steady state of
                # a cached generic plan (no planning), which is what a long-lived worker runs.
                notices.clear()
                row = conn.execute(stmt).fetchone()
        finally:
            conn.remove_notice_handler(collect)
    assert row is not None
    raw = row[0]
    doc: dict[str, Any] = (json.loads(raw) if isinstance(raw, str) else raw)[0]
    doc["Nested Plans"] = nested_plans(notices)
    return doc, summarise(doc, mode, str(params["queue"]), order.index("queue") + 1)


# auto_explain, for the statements run inside functions (log_nested_statements).
NESTED_EXPLAIN = {"log_min_duration": "0", "log_analyze": "on", "log_buffers": "on",
                  "log_nested_statements": "on", "log_format": "json", "log_level": "notice",
                  "log_timing": "off"}


def nested_plans(notices: list[str]) -> list[dict[str, Any]]:
    """The plans auto_explain reported for statements run inside functions (not the EXPLAIN)."""
    out = []
    for message in notices:
        head, sep, body = message.partition("\n")
        if not sep or not head.startswith("duration:") or "plan:" not in head:
            continue
        doc = json.loads(body)
        text = str(doc.get("Query Text", "")).lstrip()
        # the EXPLAIN itself, and the statement it executes (fairq's statements are labelled)
        if text.upper().startswith("EXPLAIN") or text.startswith("-- fairq "):
            continue
        out.append(doc["Plan"])
    return out


def explain_case(conn: psycopg.Connection[Any], statement: str, policy: str, *, batch: int,
                 schema: str = SCHEMA, queue: str = QUEUE, settings: Mapping[str, str] | None = None
                 ) -> dict[str, tuple[dict[str, Any], PlanSummary]]:
    """Custom and generic plans of one claim statement with one policy's parameters."""
    params = params_for(policy, batch=batch, queue=queue)
    text = fsql.statement(statement, schema)
    out = {}
    for mode in ("custom", "generic"):
        # Prepared again each time: the EXPLAIN's rollback makes psycopg deallocate everything.
        name, types, order = prepare_like_psycopg(conn, text, params)
        out[mode] = explain_prepared(conn, name, types, order, params, mode, settings)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", default=os.environ.get("FAIRQ_DATABASE_URL") or DEFAULT_DSN)
    ap.add_argument("--tenants", type=int, default=100_000)
    ap.add_argument("--queued-per-tenant", type=int, default=2)
    ap.add_argument("--finished", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--json", action="store_true", help="print the raw plans too")
    args = ap.parse_args(argv)
    from fairq import migrate

    db = create_db(args.dsn)
    try:
        dsn = with_db(args.dsn, db)
        migrate.upgrade(dsn, SCHEMA)
        load(dsn, tenants=args.tenants, queued_per_tenant=args.queued_per_tenant, finished=args.finished)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for label, policy, statement in CASES:
                for _mode, (doc, s) in explain_case(conn, statement, policy, batch=args.batch).items():
                    print(label, json.dumps(asdict(s)))
                    if args.json:
                        print(json.dumps(doc, indent=1))
    finally:
        drop_db(args.dsn, db)
    return 0


if __name__ == "__main__":
    sys.exit(main())
