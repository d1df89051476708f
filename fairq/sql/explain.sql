-- Why a tenant's next job has not started (`fairq tenants explain`, `fairq stats`'s reason, the
-- exporter's fairq_tenants_waiting): read-only, from the database at that moment. {schema} is the
-- quoted schema identifier. docs/explain.md defines each reason and the order they are checked in.

-- name: tenant_waits
-- One row per (queue, tenant) of the schedule, in the queue %(queue)s and of the tenant
-- %(tenant)s (NULL: every one), with its reason and the facts behind it.
-- Linear in the tenants of the queues it reads, whatever the statistics say: one pass over
-- their schedule rows, each probing its own jobs by index (counted only for the tenants asked
-- about), window aggregates over the queue for the order and the groups, and joins only with
-- one row per queue. (A join of two per-tenant sets on (queue, tenant) was planned as a merge on
-- the queue alone, quadratic in the tenants of a queue.)
WITH tenant_rows AS MATERIALIZED (
    SELECT ts.queue, ts.tenant, ts.vtime, ts.active, ts.running, ts.max_running, ts.rate,
           coalesce(ts.tenant_group, 'default') AS grp,
           (%(tenant)s::text IS NULL OR ts.tenant = %(tenant)s::text) AS asked,
           {schema}.tenant_dry(ts) AS dry, {schema}.token_due(ts) AS token_due,
           {schema}.tenant_tokens(ts) AS tokens,
           -- Its effective weight, with the engine's factor for its group (group_schedule).
           {schema}.effective_weight(ts.weight, (
               SELECT g.factor FROM {schema}.group_schedule g
               WHERE g.queue = ts.queue
                 AND g.tenant_group = coalesce(ts.tenant_group, 'default'))) AS eff,
           -- Competing: in the runnable set (the claim's walk: active, below its cap), with
           -- room (a token if rate-limited) and a due job.
           ts.active AND ts.running < ts.max_running AND {schema}.claim_room(ts) > 0
               AND EXISTS (SELECT 1 FROM {schema}.jobs j
                           WHERE j.queue = ts.queue AND j.tenant = ts.tenant
                             AND j.status = 'queued' AND j.run_at <= now()) AS competing,
           b.queued, b.due, b.next_run_at
    FROM {schema}.tenant_schedule ts
    CROSS JOIN LATERAL (
        SELECT count(*) AS queued, count(*) FILTER (WHERE j.run_at <= now()) AS due,
               min(j.run_at) AS next_run_at
        FROM {schema}.jobs j
        WHERE j.queue = ts.queue AND j.tenant = ts.tenant AND j.status = 'queued'
          AND (%(tenant)s::text IS NULL OR ts.tenant = %(tenant)s::text)) b
    WHERE (%(queue)s::text IS NULL OR ts.queue = %(queue)s::text)
      AND (%(tenant)s::text IS NULL OR ts.queue IN (
          SELECT s.queue FROM {schema}.tenant_schedule s WHERE s.tenant = %(tenant)s::text))
),
-- Per tenant: the competing tenants before it in the claim's (vtime, tenant) order, and those
-- of them in its own group; its group's running jobs and effective weight, the queue's, and
-- whether more than one group has active tenants in the queue.
queue_view AS (
    SELECT r.*,
           count(*) FILTER (WHERE r.competing) OVER (
               PARTITION BY r.queue ORDER BY r.vtime, r.tenant
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS ahead_all,
           count(*) FILTER (WHERE r.competing) OVER (
               PARTITION BY r.queue, r.grp ORDER BY r.vtime, r.tenant
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS ahead_same_group,
           sum(r.running) OVER (PARTITION BY r.queue, r.grp) AS group_running,
           sum(r.eff) FILTER (WHERE r.active) OVER (PARTITION BY r.queue, r.grp) AS group_eff,
           sum(r.running) OVER (PARTITION BY r.queue) AS queue_running,
           sum(r.eff) FILTER (WHERE r.active) OVER (PARTITION BY r.queue) AS queue_eff,
           min(r.grp) FILTER (WHERE r.active) OVER (PARTITION BY r.queue)
               IS DISTINCT FROM max(r.grp) FILTER (WHERE r.active) OVER (PARTITION BY r.queue)
               AS several_groups
    FROM tenant_rows r
),
-- The workers serving each queue read: alive while seen within %(missed_beats)s of their beats.
served AS (
    SELECT q.queue,
           count(*) FILTER (WHERE w.alive) AS workers,
           coalesce(array_agg(DISTINCT w.policy ORDER BY w.policy) FILTER (WHERE w.alive),
                    '{{}}') AS policies,
           max(w.seen_at) FILTER (WHERE NOT w.alive) AS last_seen_at
    FROM (SELECT DISTINCT r.queue FROM tenant_rows r) q
    LEFT JOIN (SELECT wk.queues, wk.policy, wk.seen_at,
                      wk.seen_at >= now() - make_interval(
                          secs => wk.beat_seconds * %(missed_beats)s::float8) AS alive
               FROM {schema}.workers wk) w ON q.queue = ANY (w.queues)
    GROUP BY q.queue
),
facts AS (
    SELECT v.*, s.workers, s.policies, s.last_seen_at,
           CASE WHEN v.competing THEN v.ahead_all ELSE 0 END AS ahead,
           CASE WHEN v.competing THEN v.ahead_all - v.ahead_same_group ELSE 0 END AS ahead_other,
           v.group_eff / nullif(v.queue_eff, 0) AS group_share,
           NOT EXISTS (SELECT 1 FROM {schema}.tenants t WHERE t.tenant = v.tenant)
               AS cap_is_default
    FROM queue_view v JOIN served s ON s.queue = v.queue
    WHERE v.asked
)
-- The reasons in the order they are checked (docs/explain.md): the first that holds.
SELECT f.queue, f.tenant,
       CASE WHEN f.queued = 0 AND f.running = 0 THEN 'no_jobs'
            WHEN f.workers = 0 THEN 'no_worker'
            WHEN f.queued = 0 THEN 'running'
            WHEN f.running >= f.max_running THEN 'at_cap'
            WHEN f.dry AND f.token_due > f.next_run_at THEN 'rate_limited'
            WHEN f.due = 0 THEN 'no_due_jobs'
            WHEN f.ahead_other > 0 AND f.several_groups AND f.queue_running > 0
                 AND f.group_running >= f.group_share * f.queue_running THEN 'group_at_share'
            ELSE 'waiting_turn' END AS reason,
       f.queued::int AS queued, f.due::int AS due, f.running, f.max_running, f.cap_is_default,
       CASE WHEN f.queued > 0 AND f.due = 0 THEN f.next_run_at END AS next_due_at,
       f.rate, f.tokens, CASE WHEN f.dry THEN f.token_due END AS next_token_at,
       f.ahead::int AS ahead, f.ahead_other::int AS ahead_other_groups,
       f.grp AS tenant_group, f.group_running::int AS group_running, f.group_share,
       f.queue_running::int AS queue_running, f.workers::int AS workers, f.policies,
       f.last_seen_at AS last_worker_seen_at, now() AS checked_at
FROM facts f
ORDER BY f.queue, f.tenant;
