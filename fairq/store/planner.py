"""The planner settings every fairq session runs under: generic plans, and no plan shape that
reads a whole table. A direct connection gets them at connect time (libpq
``options``), a session behind a transaction-mode pooler per transaction."""

from __future__ import annotations

# fairq's statements are planned once: their generic plans have the same guarded shapes
# (tests/integration/test_claim_plans.py) and skip the 1-2 ms of planning a custom plan costs per claim.
PLAN_CACHE_MODE = "force_generic_plan"
# ...and those plans must not depend on row estimates a generic plan cannot have (how many
# rows a CTE yields, how big the hot tenant_schedule was when the plan was cached): every fairq
# statement joins a batch-sized set to an indexed table, so nested loops over index probes are
# always right, while a hash or merge join, or a seq scan, reads the whole table. (fairq stats,
# which aggregates whole tables, restores the defaults in its transaction; the exporter and the
# probe use connections of their own.)
# JIT off too: its compile time (tens of ms) dwarfs a 1 ms claim, and the disabled paths'
# cost penalties would otherwise push a plan's estimate over jit_above_cost.
# Bitmap scans off too: a bitmap scan returns rows in no order, so a walk of the runnable index
# in (vtime, tenant) order became "read every runnable tenant, then sort" whenever the planner
# misjudged how far the walk goes (100,000 tenants: 5,725 buffers, 0.7 s per claim); a plain
# index scan gives the order and stops with the walk.
# Sorts off too, for the same walk: with tenant_schedule analyzed while it held one row, then
# hundreds of tenants enqueued (statistics are stale after every burst), the planner found
# "read the queue's tenants by primary key, then sort" as cheap as the runnable index, and each
# fair claim read every tenant of the queue (704 rows in test_plan_states' analyzed_one_tenant).
# A sort that has no alternative (a batch's rows, a CTE's few) still runs. What the setting
# asks of the statements: a set of rows locked in key order is its few keys sorted, then each
# row locked by its key (the finishes and the reaper, fairq/sql/jobs.sql; the SQL enqueue;
# retry and rebase), never a join ordered by a table's key, which the planner
# would read whole in that order rather than sort a handful (one job enqueued among 20,000
# tenants read 344 buffers in 14 ms that way, against 22 in 1 ms); and no "ORDER BY id LIMIT"
# over a filtered set (cancel_tenant asks for no order). Every named statement's generic plan
# was compared with sorts on and off in the plan-test states: the others differ only in a hash
# aggregate where a sort and group were.
PLANNER_SETTINGS = {"enable_seqscan": "off", "enable_hashjoin": "off", "enable_mergejoin": "off",
                    "enable_bitmapscan": "off", "enable_sort": "off", "jit": "off"}


# fairq's own sessions search only pg_catalog (its statements name every object of its schema):
# an operator or function someone created in a schema the role's or database's search_path
# lists (public) can never be picked for one of fairq's expressions.
SEARCH_PATH = "-c search_path=pg_catalog,pg_temp"


def planner_options() -> str:
    """The libpq ``options`` that give a session fairq's planner settings (tests explain with it)."""
    settings = {"plan_cache_mode": PLAN_CACHE_MODE, **PLANNER_SETTINGS}
    return " ".join(f"-c {k}={v}" for k, v in settings.items())
