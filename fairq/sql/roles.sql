-- Least-privilege grants (docs/roles.md), run by the owner of fairq's schema after each
-- `fairq migrate`. Rendered by fairq/roles.py: {schema} and the role placeholders are quoted
-- identifiers. Each block is one statement group; run them with `fairq roles --apply` or print
-- them with `fairq roles --print`.

-- name: roles_grant_worker
-- Claim, heartbeat, finish, fail, hand back, reap and wake: UPDATEs of jobs and the schedule,
-- the maintenance timestamps in settings, the groups' factors. No INSERT into jobs (cannot enqueue), no DELETE, no
-- tenant configuration. It reads the schema's revision at start (it refuses an outdated one).
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT SELECT, UPDATE ON {schema}.jobs TO {role};
GRANT SELECT, UPDATE ON {schema}.tenant_schedule TO {role};
GRANT SELECT, INSERT, UPDATE ON {schema}.settings TO {role};
GRANT SELECT ON {schema}.alembic_version TO {role};
-- Tenant groups: a claim reads the groups and refreshes its queue's factors.
GRANT SELECT ON {schema}.tenant_groups TO {role};
GRANT SELECT, INSERT, DELETE ON {schema}.group_schedule TO {role};

-- name: roles_grant_worker_prune
-- Only for workers that run the pruner (Worker(prune_after=...)); otherwise prune as the owner.
GRANT DELETE ON {schema}.jobs TO {role};

-- name: roles_grant_producer
-- Enqueue: insert jobs and read back only their ids, create or wake the tenants' schedule rows
-- (never their running counts or configuration), read the tenants' settings.
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT INSERT (queue, tenant, task, payload, priority, cost, run_at, max_attempts, lease_seconds)
    ON {schema}.jobs TO {role};
GRANT SELECT (id, queue, tenant, run_at) ON {schema}.jobs TO {role};
GRANT SELECT ON {schema}.tenant_schedule TO {role};
GRANT INSERT (queue, tenant, weight, max_running, vtime, active, wake_at, rate, burst,
                tenant_group)
    ON {schema}.tenant_schedule TO {role};
GRANT UPDATE (active, vtime, wake_at) ON {schema}.tenant_schedule TO {role};
GRANT SELECT ON {schema}.tenants, {schema}.settings TO {role};

-- name: roles_grant_monitor
-- Read-only: `fairq stats` and `fairq exporter` (with pg_stat_statements, or --no-probe: the
-- sampled EXPLAIN ANALYZE probe runs the claim, which needs the worker's UPDATE grants).
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {role};
