-- Read-only statistics for `fairq stats`. Both run in one short transaction.

-- name: stats_timeouts
-- The stats query scans the jobs table: bound it so it can never become a long transaction
-- on a big or busy queue.
-- It aggregates over whole tables, so it also gets the planner's defaults back: fairq's own
-- sessions turn off seq scans, sorts, hash and merge joins for the short claim-path statements.
SELECT set_config('statement_timeout', %(timeout_ms)s::text, true),
       set_config('lock_timeout', '1000', true),
       set_config('transaction_read_only', 'on', true),
       set_config('enable_seqscan', 'on', true),
       set_config('enable_hashjoin', 'on', true),
       set_config('enable_mergejoin', 'on', true),
       set_config('enable_bitmapscan', 'on', true),
       set_config('enable_sort', 'on', true),
       set_config('plan_cache_mode', 'auto', true);

-- name: tenant_stats
-- One row per (queue, tenant) with jobs or scheduling state. claim_share is the tenant's share
-- of the jobs started in the last %(window)s seconds (tenant_schedule.claimed_total is
-- cumulative since the tenant first appeared, so it cannot show recent fairness);
-- weight_share is its share of the weight of the tenants active now (due or running jobs: a
-- tenant with only delayed jobs, or idle since its last claims, competes for nothing), which is
-- what a fair policy aims claim_share at, and what the dashboards' weight share counts.
WITH counts AS (
    SELECT j.queue, j.tenant,
           count(*) FILTER (WHERE j.status = 'queued' AND j.run_at <= now()) AS due,
           count(*) FILTER (WHERE j.status = 'queued' AND j.run_at > now()) AS delayed,
           count(*) FILTER (WHERE j.status = 'running') AS running,
           count(*) FILTER (WHERE j.status = 'done') AS done,
           count(*) FILTER (WHERE j.status = 'failed') AS failed,
           count(*) FILTER (WHERE j.started_at >= now() - make_interval(secs => %(window)s::float8))
               AS recent_claims,
           min(j.run_at) FILTER (WHERE j.status = 'queued' AND j.run_at <= now()) AS oldest_due
    FROM {schema}.jobs j
    WHERE %(queue)s::text IS NULL OR j.queue = %(queue)s::text
    GROUP BY j.queue, j.tenant
),
defaults AS (
    SELECT (value->>'weight')::float8 AS weight, (value->>'max_running')::int AS max_running
    FROM {schema}.settings WHERE key = 'tenant_defaults'
),
merged AS (
    SELECT coalesce(c.queue, ts.queue) AS queue,
           coalesce(c.tenant, ts.tenant) AS tenant,
           coalesce(c.due, 0) AS due,
           coalesce(c.delayed, 0) AS delayed,
           coalesce(c.running, 0) AS running,
           coalesce(ts.max_running, t.max_running, d.max_running, 10) AS max_running,
           coalesce(ts.weight, t.weight, d.weight, 1.0) AS weight,
           coalesce(c.done, 0) AS done,
           coalesce(c.failed, 0) AS failed,
           coalesce(c.recent_claims, 0) AS recent_claims,
           c.oldest_due,
           ts.rate, {schema}.tenant_tokens(ts) AS tokens,
           coalesce({schema}.throttled_total(ts), 0.0) AS throttled_seconds,
           coalesce(ts.tenant_group, t.tenant_group, 'default') AS tenant_group
    FROM counts c
    FULL JOIN {schema}.tenant_schedule ts ON ts.queue = c.queue AND ts.tenant = c.tenant
    LEFT JOIN {schema}.tenants t ON t.tenant = coalesce(c.tenant, ts.tenant)
    LEFT JOIN defaults d ON true
    WHERE %(queue)s::text IS NULL OR coalesce(c.queue, ts.queue) = %(queue)s::text
),
flagged AS (
    SELECT m.*, (m.due > 0 OR m.running > 0) AS active FROM merged m
),
-- With tenant groups, a tenant's weight is its share of its group's weight (docs/algorithm.md,
-- "Tenant groups"); without groups this is proportional to its own weight.
effective AS (
    SELECT f.*, f.weight * coalesce((SELECT tg.weight FROM {schema}.tenant_groups tg
                                     WHERE tg.tenant_group = f.tenant_group), 1.0)
               / nullif(sum(f.weight) FILTER (WHERE f.active)
                            OVER (PARTITION BY f.queue, f.tenant_group), 0) AS eff
    FROM flagged f
)
SELECT f.queue, f.tenant, f.due, f.delayed, f.running, f.max_running, f.weight, f.done, f.failed,
       f.recent_claims, f.active,
       f.recent_claims::float8
           / nullif(sum(f.recent_claims) OVER (PARTITION BY f.queue), 0) AS claim_share,
       CASE WHEN f.active THEN f.eff
           / nullif(sum(f.eff) FILTER (WHERE f.active) OVER (PARTITION BY f.queue), 0) END
           AS weight_share,
       extract(epoch FROM now() - f.oldest_due)::float8 AS oldest_wait_seconds,
       f.rate, f.tokens, f.tenant_group, f.throttled_seconds
FROM effective f
ORDER BY f.queue, f.tenant;
