-- Why a tenant's next job has not started (`fairq tenants explain`, `fairq stats`'s reason, the
-- exporter's fairq_tenants_waiting): read-only, from the database at that moment. {schema} is the
-- quoted schema identifier. docs/explain.md defines each reason and the order they are checked in.

-- name: tenant_waits
-- One row per (queue, tenant) of the schedule, in the queue %(queue)s and of the tenant
-- %(tenant)s (NULL: every one), with its reason and the facts behind it. Set-based and linear
-- in the tenants of the queues it reads: one pass over their schedule rows (a sort of the
-- runnable ones for their order) and one over their queued jobs, whatever the number of
-- tenants asked about.
WITH asked AS MATERIALIZED (
    SELECT ts.queue, ts.tenant, ts.running, ts.max_running, ts.rate,
           coalesce(ts.tenant_group, 'default') AS grp,
           {schema}.tenant_dry(ts) AS dry, {schema}.token_due(ts) AS token_due,
           {schema}.tenant_tokens(ts) AS tokens
    FROM {schema}.tenant_schedule ts
    WHERE (%(queue)s::text IS NULL OR ts.queue = %(queue)s::text)
      AND (%(tenant)s::text IS NULL OR ts.tenant = %(tenant)s::text)
),
backlog AS (
    SELECT j.queue, j.tenant, count(*) AS queued,
           count(*) FILTER (WHERE j.run_at <= now()) AS due,
           min(j.run_at) AS next_run_at
    FROM {schema}.jobs j
    WHERE j.status = 'queued'
      AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
      AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s::text)
    GROUP BY j.queue, j.tenant
),
-- Every schedule row of the queues asked about: the order and the groups are the queue's.
-- Competing: in the runnable set (the claim's walk: active, below its cap), with room (a token
-- if rate-limited) and a due job.
queue_rows AS MATERIALIZED (
    SELECT ts.queue, ts.tenant, ts.vtime, ts.active, ts.running, ts.weight,
           coalesce(ts.tenant_group, 'default') AS grp,
           ts.active AND ts.running < ts.max_running AND {schema}.claim_room(ts) > 0
               AND EXISTS (SELECT 1 FROM {schema}.jobs j
                           WHERE j.queue = ts.queue AND j.tenant = ts.tenant
                             AND j.status = 'queued' AND j.run_at <= now()) AS competing
    FROM {schema}.tenant_schedule ts
    WHERE ts.queue IN (SELECT a.queue FROM asked a)
),
-- The competing tenants ahead of each competing tenant in the claim's (vtime, tenant) order,
-- and those of them in its own group.
ordered AS (
    SELECT r.queue, r.tenant,
           row_number() OVER (PARTITION BY r.queue ORDER BY r.vtime, r.tenant) - 1 AS ahead,
           row_number() OVER (PARTITION BY r.queue, r.grp ORDER BY r.vtime, r.tenant) - 1
               AS ahead_same_group
    FROM queue_rows r WHERE r.competing
),
-- Each group's running jobs in the queue, and its share: the effective weights (the engine's
-- factors, group_schedule) of its active tenants over those of the queue's active tenants.
groups AS (
    SELECT r.queue, r.grp, sum(r.running) AS running,
           coalesce(sum({schema}.effective_weight(r.weight, g.factor)) FILTER (WHERE r.active),
                    0.0) AS eff
    FROM queue_rows r
    LEFT JOIN {schema}.group_schedule g ON g.queue = r.queue AND g.tenant_group = r.grp
    GROUP BY r.queue, r.grp
),
queues AS (
    SELECT g.queue, sum(g.running) AS running, sum(g.eff) AS eff,
           count(*) FILTER (WHERE g.eff > 0) AS active_groups
    FROM groups g GROUP BY g.queue
),
-- The workers serving each queue asked about: alive while seen within %(missed_beats)s of their
-- beats.
served AS (
    SELECT q.queue,
           count(*) FILTER (WHERE w.alive) AS workers,
           coalesce(array_agg(DISTINCT w.policy ORDER BY w.policy) FILTER (WHERE w.alive),
                    '{{}}') AS policies,
           max(w.seen_at) FILTER (WHERE NOT w.alive) AS last_seen_at
    FROM (SELECT DISTINCT a.queue FROM asked a) q
    LEFT JOIN (SELECT wk.queues, wk.policy, wk.seen_at,
                      wk.seen_at >= now() - make_interval(
                          secs => wk.beat_seconds * %(missed_beats)s::float8) AS alive
               FROM {schema}.workers wk) w ON q.queue = ANY (w.queues)
    GROUP BY q.queue
),
facts AS (
    SELECT a.queue, a.tenant, a.grp, a.running, a.max_running, a.rate, a.tokens, a.dry,
           a.token_due, coalesce(b.queued, 0) AS queued, coalesce(b.due, 0) AS due,
           b.next_run_at, o.ahead, o.ahead_same_group,
           NOT EXISTS (SELECT 1 FROM {schema}.tenants t WHERE t.tenant = a.tenant)
               AS cap_is_default,
           g.running AS group_running, g.eff / nullif(q.eff, 0) AS group_share,
           q.running AS queue_running, q.active_groups,
           s.workers, s.policies, s.last_seen_at
    FROM asked a
    LEFT JOIN backlog b ON b.queue = a.queue AND b.tenant = a.tenant
    LEFT JOIN ordered o ON o.queue = a.queue AND o.tenant = a.tenant
    JOIN groups g ON g.queue = a.queue AND g.grp = a.grp
    JOIN queues q ON q.queue = a.queue
    JOIN served s ON s.queue = a.queue
)
-- The reasons in the order they are checked (docs/explain.md): the first that holds.
SELECT f.queue, f.tenant,
       CASE WHEN f.queued = 0 AND f.running = 0 THEN 'no_jobs'
            WHEN f.workers = 0 THEN 'no_worker'
            WHEN f.queued = 0 THEN 'running'
            WHEN f.running >= f.max_running THEN 'at_cap'
            WHEN f.dry AND f.token_due > f.next_run_at THEN 'rate_limited'
            WHEN f.due = 0 THEN 'no_due_jobs'
            WHEN f.ahead - f.ahead_same_group > 0 AND f.active_groups > 1
                 AND f.queue_running > 0
                 AND f.group_running >= f.group_share * f.queue_running THEN 'group_at_share'
            ELSE 'waiting_turn' END AS reason,
       f.queued::int AS queued, f.due::int AS due, f.running, f.max_running, f.cap_is_default,
       CASE WHEN f.queued > 0 AND f.due = 0 THEN f.next_run_at END AS next_due_at,
       f.rate, f.tokens, CASE WHEN f.dry THEN f.token_due END AS next_token_at,
       coalesce(f.ahead, 0)::int AS ahead,
       coalesce(f.ahead - f.ahead_same_group, 0)::int AS ahead_other_groups,
       f.grp AS tenant_group, f.group_running::int AS group_running, f.group_share,
       f.queue_running::int AS queue_running, f.workers::int AS workers, f.policies,
       f.last_seen_at AS last_worker_seen_at, now() AS checked_at
FROM facts f
ORDER BY f.queue, f.tenant;
