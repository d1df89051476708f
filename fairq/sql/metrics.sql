-- Read-only statements of the metrics side: the claim probe (fairq/metrics/probe.py), the database
-- exporter (fairq/metrics/exporter.py) and the health checks, all run by the store's monitoring part
-- (fairq/store/monitor.py). Workers never run these on their claim path. Every read but the
-- health check's SELECT 1 runs under a statement timeout.

-- name: metrics_timeouts
-- Per-transaction limits: a scrape must never hang on a lock or a slow plan; only pg_catalog
-- searched (fairq/store/planner.py, SEARCH_PATH says why). JIT off: compiling the exporter's
-- read of every tenant took longer (0.5 s at 100,000 tenants) than running it.
SELECT set_config('statement_timeout', %(statement_ms)s, true),
       set_config('lock_timeout', %(lock_ms)s, true),
       set_config('search_path', 'pg_catalog, pg_temp', true),
       set_config('jit', 'off', true);

-- name: pgss_status
-- Is pg_stat_statements usable here (preloaded *and* created in this database), and does it
-- record planning? track_planning is off by default, and then plans and total_plan_time are 0.
SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements') AS installed,
       coalesce(current_setting('shared_preload_libraries', true), '') AS preload,
       coalesce(current_setting('pg_stat_statements.track_planning', true), 'off') AS track_planning;

-- name: pgss_claim_stats
-- Cumulative counters of one claim statement in this database, matched by the statement's text
-- up to its first parameter (pg_stat_statements keeps the text as sent, comments included, and
-- the quoted schema name in that prefix tells schemas apart).
SELECT coalesce(sum(s.calls), 0)::float8 AS calls,
       coalesce(sum(s.plans), 0)::float8 AS plans,
       coalesce(sum(s.total_plan_time), 0)::float8 AS plan_ms,
       coalesce(sum(s.total_exec_time), 0)::float8 AS exec_ms
FROM pg_stat_statements s
WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND starts_with(s.query, %(prefix)s);

-- name: probe_queue
-- The queue the sampled probe explains the claim on: the one with the most runnable tenants.
SELECT coalesce(
    (SELECT ts.queue FROM {schema}.tenant_schedule ts
     GROUP BY ts.queue
     ORDER BY count(*) FILTER (WHERE ts.active) DESC, sum(ts.claimed_total) DESC, ts.queue
     LIMIT 1),
    'default') AS queue;

-- name: prepared_plan_counts
-- How often this session's prepared statement was planned afresh (custom) or reused (generic).
SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = %(name)s;

-- name: exporter_tenants
-- Per (queue, tenant): configuration, exact running count, backlog, oldest runnable age, time
-- spent throttled so far, and for a backlogged tenant (runnable jobs, not paused) the weight
-- its fairness is judged against: its effective weight (effective_weight), its group's factor
-- taken over the queue's backlogged tenants of the group (NULL for the others).
-- The backlog aggregate reads the partial index of queued jobs only. Linear in tenants: each
-- table read once and joined by hash (the exporter's session keeps the planner's defaults), the
-- groups' sums aggregated once, no order asked for (the exporter sorts what it keeps), and the
-- rate-limit functions called only on the rows with a rate limit or an open throttled interval.
WITH backlog AS (
    SELECT j.queue, j.tenant, count(*) AS queued,
           count(*) FILTER (WHERE j.run_at <= now()) AS runnable,
           extract(epoch FROM now() - min(j.run_at) FILTER (WHERE j.run_at <= now())) AS oldest_age
    FROM {schema}.jobs j
    WHERE j.status = 'queued'
    GROUP BY j.queue, j.tenant
),
tenants AS MATERIALIZED (
    SELECT ts.queue, ts.tenant, ts.weight, ts.max_running,
           ts.running - coalesce(sr.n, 0) AS running, ts.claimed_total,
           coalesce(b.queued, 0) AS queued, coalesce(b.runnable, 0) AS runnable,
           coalesce(b.oldest_age, 0)::float8 AS oldest_age,
           ts.rate,
           CASE WHEN ts.rate IS NOT NULL THEN {schema}.tenant_tokens(ts) END AS tokens,
           CASE WHEN ts.rate IS NOT NULL AND NOT ts.active AND ts.wake_at > now()
                THEN {schema}.tenant_dry(ts) ELSE false END AS throttled,
           CASE WHEN ts.throttled_since IS NOT NULL THEN {schema}.throttled_total(ts)
                ELSE ts.throttled_seconds END AS throttled_seconds,
           coalesce(ts.tenant_group, 'default') AS tenant_group,
           coalesce(tg.weight, 1.0) AS group_weight,
           coalesce(b.runnable, 0) > 0 AND ts.max_running > 0 AS backlogged
    FROM {schema}.tenant_schedule ts
    LEFT JOIN backlog b ON b.queue = ts.queue AND b.tenant = ts.tenant
    -- slots given back but not yet folded into `running` (slots.sql)
    -- and slots counted ahead for workers, not started yet (claim.sql)
    LEFT JOIN (SELECT u.queue, u.tenant, sum(u.n) AS n
               FROM (SELECT r.queue, r.tenant, r.n FROM {schema}.slot_returns r
                     UNION ALL
                     SELECT b.queue, b.tenant, b.slots FROM {schema}.claim_budgets b) u
               GROUP BY u.queue, u.tenant) sr ON sr.queue = ts.queue AND sr.tenant = ts.tenant
    LEFT JOIN {schema}.tenant_groups tg ON tg.tenant_group = coalesce(ts.tenant_group, 'default')
),
group_sums AS (
    SELECT t.queue, t.tenant_group, sum(t.weight) AS weight
    FROM tenants t WHERE t.backlogged
    GROUP BY t.queue, t.tenant_group
)
SELECT t.queue, t.tenant, t.weight, t.max_running, t.running, t.claimed_total, t.queued,
       t.runnable, t.oldest_age, t.rate, t.tokens, t.throttled, t.throttled_seconds,
       t.tenant_group, t.group_weight,
       CASE WHEN t.backlogged
            THEN {schema}.effective_weight(t.weight, t.group_weight / g.weight) END
           AS effective_weight
FROM tenants t
LEFT JOIN group_sums g ON g.queue = t.queue AND g.tenant_group = t.tenant_group;

-- name: exporter_expired_leases
-- Running jobs whose lease has expired and that no reaper has returned yet (jobs_lease_idx).
SELECT j.queue, count(*) AS expired
FROM {schema}.jobs j
WHERE j.status = 'running' AND j.locked_until < now()
GROUP BY j.queue;

-- name: exporter_jobs_table
-- Vacuum health of the jobs table, and the rows ever inserted into it: every enqueue, from
-- any process (the workers' fairq_jobs_enqueued_total sees only their own).
SELECT s.n_dead_tup::float8 AS dead, s.n_live_tup::float8 AS live,
       extract(epoch FROM s.last_autovacuum)::float8 AS last_autovacuum,
       extract(epoch FROM s.last_vacuum)::float8 AS last_vacuum,
       s.autovacuum_count::float8 AS autovacuum_count,
       s.n_tup_ins::float8 AS inserted
FROM pg_stat_user_tables s
WHERE s.schemaname = %(schema)s AND s.relname = 'jobs';

-- name: ping
-- The health checks' question (fairq.metrics.checks.db_check): does the database answer?
SELECT 1 AS ok;
