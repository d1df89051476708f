"""functions that trust no search path, keys per tenant, bounded run_at and group factors

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-05

- Every plpgsql function pins ``search_path = pg_catalog, pg_temp``; the small sql functions
  that PostgreSQL inlines (a SET clause would stop that) name nothing through the caller's
  search path (operators as ``OPERATOR(pg_catalog.op)``, qualified functions and casts).
- refresh_groups runs as the schema's owner (SECURITY DEFINER), so the roles that wrote
  group_schedule for it lose that: they get EXECUTE on it instead.
- group_schedule: a factor in (0, 1e6] (a group's weight, at most 1000, over a tenant's weight,
  at least 0.001) and a refreshed_at before infinity; effective_weight caps a tenant at 1000.
- Idempotency keys are per tenant: jobs_key_idx is unique on (task, tenant, key).
- jobs.run_at lies in [1970-01-01, 9999-01-01) UTC (jobs_run_at_check): a job stored outside it
  is moved to the nearest end first (before 1970 it was due anyway).

Self-contained: the functions it installs are in ``0003_search_path_keys_bounds/``, the ones its
downgrade puts back in ``0003_search_path_keys_bounds/down/`` (copies of the baseline's).
"""
from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

FOLDER = "0003_search_path_keys_bounds"
# In the order they must be created (a sql function's body is checked against the functions it
# calls when it is created). Each file says CREATE OR REPLACE: a function keeps its owner and
# its grants (the producer's EXECUTE on enqueue) across the upgrade and the downgrade.
FUNCTION_FILES = ("vtime.sql", "rate_limits.sql", "weights.sql", "settle.sql", "claim.sql",
                  "enqueue.sql")
RUN_AT_CHECK = ("run_at >= '1970-01-01 00:00:00+00'::timestamptz "
                "AND run_at < '9999-01-01 00:00:00+00'::timestamptz")
FACTOR_CHECK = "factor > 0 AND factor <= 1000000"
REFRESHED_CHECK = "refreshed_at < 'infinity'::timestamptz"
KEY_WHERE = "key IS NOT NULL AND status IN ('queued', 'running')"
WRITES = "INSERT, UPDATE, DELETE, TRUNCATE"


def _schema() -> str:
    return str(op.get_context().opts["version_table_schema"])


def _folder() -> Traversable:
    """This migration's SQL: package data of ``fairq.migrations.versions`` in an installed
    fairq; in a checkout (where ``alembic/`` is not importable under that name), beside this
    file."""
    try:
        return resources.files("fairq.migrations.versions").joinpath(FOLDER)
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent / FOLDER


def _execute(ddl: str) -> None:
    op.execute(sa.text(ddl).execution_options(no_parameters=True))


def _functions(folder: Traversable, s: str) -> None:
    for name in FUNCTION_FILES:
        text = folder.joinpath(name).read_text(encoding="utf-8")
        _execute(text.replace("{schema}", f'"{s}"').replace("{channel}", f"'fairq_{s}'"))


def _writers(s: str) -> str:
    """A query of the roles other than the owner (and PUBLIC) that may insert into
    group_schedule."""
    return (f"SELECT r.rolname FROM pg_roles r WHERE r.oid IN ("
            f"SELECT a.grantee FROM pg_class c, aclexplode(c.relacl) a "
            f"WHERE c.oid = '\"{s}\".group_schedule'::regclass AND a.grantee <> c.relowner "
            f"AND a.privilege_type = 'INSERT')")


def _runners(s: str) -> str:
    """A query of the roles other than the owner (and PUBLIC) granted EXECUTE on
    refresh_groups."""
    return (f"SELECT r.rolname FROM pg_roles r WHERE r.oid IN ("
            f"SELECT a.grantee FROM pg_proc p, aclexplode(p.proacl) a "
            f"WHERE p.oid = '\"{s}\".refresh_groups(text)'::regprocedure "
            f"AND a.grantee <> p.proowner AND a.privilege_type = 'EXECUTE')")


def upgrade() -> None:
    s = _schema()
    q = f'"{s}"'
    # The roles that wrote group_schedule (the workers, for refresh_groups) may run it instead,
    # so running workers keep claiming; their writes go. Before the functions change (the new
    # refresh_groups revokes EXECUTE from PUBLIC).
    _execute(f"""DO $$
DECLARE
    r text;
BEGIN
    FOR r IN {_writers(s)} LOOP
        EXECUTE 'REVOKE {WRITES} ON {q}.group_schedule FROM ' || quote_ident(r);
        EXECUTE 'GRANT EXECUTE ON FUNCTION {q}.refresh_groups(text) TO ' || quote_ident(r);
    END LOOP;
END
$$""")
    _execute(f"REVOKE {WRITES} ON {q}.group_schedule FROM PUBLIC")

    # Times a client can decode; what lies outside moves to the nearest end.
    _execute(f"UPDATE {q}.jobs SET run_at = CASE "
             "WHEN run_at < '1970-01-01 00:00:00+00'::timestamptz "
             "THEN '1970-01-01 00:00:00+00'::timestamptz "
             "ELSE '9999-01-01 00:00:00+00'::timestamptz - interval '1 microsecond' END "
             f"WHERE NOT ({RUN_AT_CHECK})")
    op.create_check_constraint("jobs_run_at_check", "jobs", sa.text(RUN_AT_CHECK), schema=s)
    _execute(f"DELETE FROM {q}.group_schedule WHERE NOT ({FACTOR_CHECK} AND {REFRESHED_CHECK})")
    op.create_check_constraint("group_schedule_factor_check", "group_schedule",
                               sa.text(FACTOR_CHECK), schema=s)
    op.create_check_constraint("group_schedule_refreshed_at_check", "group_schedule",
                               sa.text(REFRESHED_CHECK), schema=s)

    # Keys per tenant: every (task, key) pair was unique, so every (task, tenant, key) is.
    op.drop_index("jobs_key_idx", table_name="jobs", schema=s)
    op.create_index("jobs_key_idx", "jobs", ["task", "tenant", "key"], unique=True, schema=s,
                    postgresql_where=sa.text(KEY_WHERE))

    _functions(_folder(), s)


def downgrade() -> None:
    s = _schema()
    q = f'"{s}"'
    # Two tenants may hold a live job with the same task and key now: the older index cannot.
    _execute(f"""DO $$
BEGIN
    IF EXISTS (SELECT FROM {q}.jobs WHERE {KEY_WHERE}
               GROUP BY task, key HAVING count(*) > 1) THEN
        RAISE EXCEPTION 'fairq: cannot downgrade: two tenants have a queued or running job '
                        'with the same task and key';
    END IF;
END
$$""")
    _functions(_folder().joinpath("down"), s)
    op.drop_index("jobs_key_idx", table_name="jobs", schema=s)
    op.create_index("jobs_key_idx", "jobs", ["task", "key"], unique=True, schema=s,
                    postgresql_where=sa.text(KEY_WHERE))
    op.drop_constraint("group_schedule_refreshed_at_check", "group_schedule", schema=s)
    op.drop_constraint("group_schedule_factor_check", "group_schedule", schema=s)
    op.drop_constraint("jobs_run_at_check", "jobs", schema=s)
    # refresh_groups runs as its caller again: the roles allowed to run it write for it.
    _execute(f"""DO $$
DECLARE
    r text;
BEGIN
    FOR r IN {_runners(s)} LOOP
        EXECUTE 'GRANT INSERT, DELETE ON {q}.group_schedule TO ' || quote_ident(r);
        EXECUTE 'REVOKE EXECUTE ON FUNCTION {q}.refresh_groups(text) FROM ' || quote_ident(r);
    END LOOP;
END
$$""")
    _execute(f"GRANT EXECUTE ON FUNCTION {q}.refresh_groups(text) TO PUBLIC")
