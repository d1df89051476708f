-- Least-privilege grants (docs/roles.md), run by the owner of fairq's schema after each
-- `fairq migrate`. Rendered by fairq/admin/roles.py: {schema} and the role placeholders are quoted
-- identifiers. Each block is one statement group; run them with `fairq roles --apply` or print
-- them with `fairq roles --print`.

-- name: roles_grant_worker
-- Claim, heartbeat, finish, fail, hand back, reap, wake and rebase virtual time: UPDATEs of the
-- columns those statements write (a job's result too), nothing else. Not a job's task, payload,
-- queue, tenant, priority, cost or limits; not a tenant's weight or cap (tenant_schedule.weight,
-- max_running); in settings only the maintenance stamps (row-level security), never the tenant
-- defaults. No INSERT into jobs (cannot enqueue), no DELETE, no tenant configuration, nothing
-- written to group_schedule (the group factors: refresh_groups writes them as the owner).
-- It reads the schema's revision at start (it refuses an outdated one). Table-wide grants are
-- revoked first (which revokes their column grants too), so re-applying leaves exactly these,
-- whatever the role held before.
GRANT USAGE ON SCHEMA {schema} TO {role};
REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON {schema}.jobs, {schema}.tenant_schedule,
    {schema}.settings, {schema}.tenants, {schema}.tenant_groups, {schema}.group_schedule,
    {schema}.workers, {schema}.slot_returns, {schema}.claim_budgets, {schema}.job_traces
    FROM {role};
GRANT SELECT ON {schema}.jobs TO {role};
GRANT UPDATE (status, attempts, run_at, started_at, finished_at, locked_until, locked_by,
              last_error, result, charged_s) ON {schema}.jobs TO {role};
GRANT SELECT ON {schema}.tenant_schedule TO {role};
GRANT UPDATE (running, vtime, active, wake_at, claimed_total, last_served_at, tokens, refilled_at,
               throttled_seconds, throttled_since, avg_run_s)
    ON {schema}.tenant_schedule TO {role};
-- Slots given back while a tenant's row was held, and their folding (slots.sql).
GRANT SELECT, INSERT, DELETE ON {schema}.slot_returns TO {role};
-- Slots counted ahead for a worker at a busy tenant (claim.sql, decision 015).
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.claim_budgets TO {role};
GRANT SELECT, INSERT (key, value), UPDATE (value) ON {schema}.settings TO {role};
GRANT SELECT ON {schema}.alembic_version TO {role};
-- The periodic schedules' last ticks. Enqueueing their jobs takes the producer's grants too.
GRANT SELECT, INSERT, UPDATE ON {schema}.periodic TO {role};
-- Tenant groups: a claim reads the groups and has refresh_groups (SECURITY DEFINER) recompute
-- its queue's factors from the tenants' configuration.
GRANT SELECT ON {schema}.tenant_groups TO {role};
GRANT SELECT ON {schema}.group_schedule TO {role};
GRANT EXECUTE ON FUNCTION {schema}.refresh_groups(text) TO {role};
-- The maintenance's repair of queued jobs without a schedule row (SECURITY DEFINER).
GRANT EXECUTE ON FUNCTION {schema}.repair_schedule(integer) TO {role};
-- The worker registry: its own row at start and at every beat, deleted at a clean stop, and the
-- rows of workers gone for a day.
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.workers TO {role};
-- The trace contexts of traced jobs (fairq.otel): each attempt reads its job's.
GRANT SELECT ON {schema}.job_traces TO {role};

-- name: roles_grant_worker_prune
-- Only for workers that run the pruner (Worker(prune_after=...)); otherwise prune as the owner.
-- A pruned job's trace context goes with it (and the pruner sweeps those whose job is gone).
GRANT DELETE ON {schema}.jobs TO {role};
GRANT DELETE ON {schema}.job_traces TO {role};

-- name: roles_grant_producer
-- Enqueue only: EXECUTE on the SQL enqueue functions, which run as the schema's owner (SECURITY
-- DEFINER) and do the checks, the job insert and the tenants' activation themselves, and on
-- trace_jobs, which stores a traced enqueue's trace context (fairq.otel) the same way. No
-- privilege on any table: a producer can neither pick a schedule row's virtual time, weight or
-- state nor read or change jobs. The REVOKE takes back any table grant the role held (so give
-- each kind its own role: it would take a worker's grants too).
REVOKE ALL ON ALL TABLES IN SCHEMA {schema} FROM {role};
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT EXECUTE ON FUNCTION
    {schema}.enqueue(text, text, jsonb, text, timestamptz, int, float8, int, int, text),
    {schema}.enqueue_many(text[], text[], jsonb[], text[], timestamptz[], float8[], int[],
                          float8[], int[], int[], text[]),
    {schema}.trace_jobs(bigint[], text, text)
    TO {role};

-- name: roles_grant_monitor
-- Read-only: `fairq stats` and `fairq exporter` (with pg_stat_statements, or --no-probe: the
-- sampled EXPLAIN ANALYZE probe runs the claim, which needs the worker's UPDATE grants).
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {role};

-- name: roles_grant_console
-- The operator console (`fairq web`) read-only: every table read, nothing written. Table-wide
-- write grants are revoked first, so re-applying without --console-actions takes back what
-- roles_grant_console_actions gave.
GRANT USAGE ON SCHEMA {schema} TO {role};
REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON ALL TABLES IN SCHEMA {schema} FROM {role};
GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {role};

-- name: roles_grant_console_actions
-- `fairq web --allow-actions`: what the operator CLI's retry, cancel and `tenants set` write,
-- column by column: a job's state (never its task, payload, tenant, queue or limits, never a
-- DELETE), a tenant's configuration and the schedule row columns that copy it, and the schedule
-- rows a retry creates or wakes. Not the tenant defaults, groups, workers or the maintenance.
GRANT UPDATE (status, attempts, run_at, started_at, finished_at, locked_until, locked_by)
    ON {schema}.jobs TO {role};
GRANT INSERT (tenant, weight, max_running, rate, burst, tenant_group, updated_at),
      UPDATE (weight, max_running, rate, burst, tenant_group, updated_at)
    ON {schema}.tenants TO {role};
GRANT INSERT (queue, tenant, weight, max_running, vtime, active),
      UPDATE (weight, max_running, rate, burst, tenant_group, tokens, refilled_at,
              throttled_seconds, throttled_since, wake_at, active, vtime)
    ON {schema}.tenant_schedule TO {role};
-- A settings change takes its tenant's settings lock first (decision 020).
GRANT EXECUTE ON FUNCTION {schema}.lock_settings(text[], boolean) TO {role};
