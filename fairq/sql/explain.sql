-- Why a tenant's next job has not started (`fairq tenants explain`, `fairq stats`'s reason, the
-- exporter's fairq_tenants_waiting): read-only, from the database at that moment. {schema} is the
-- quoted schema identifier. docs/explain.md defines each reason and the order they are checked in.

-- name: tenant_waits
-- One row per (queue, tenant) of the schedule, in the queue %(queue)s and of the tenant
-- %(tenant)s (NULL: every one), with its reason and the facts behind it.
-- Linear in the tenants of the queues it reads, whatever the statistics say: one pass over
-- their schedule rows, each probing its own jobs by index (counted only for the tenants asked
-- about), window aggregates over the queue for the order and the groups, and a join only with
-- one row per queue. (A join of two per-tenant sets on (queue, tenant) was planned as a merge on
-- the queue alone, quadratic in the tenants of a queue.) Short names: the text must stay under
-- psycopg's 4 KiB query cache with a 63-character schema name.
WITH r AS MATERIALIZED (
    SELECT ts.queue, ts.tenant, ts.vtime, ts.active, ts.running - (
               SELECT coalesce(sum(x.n), 0) FROM {schema}.slot_returns x
               WHERE x.queue = ts.queue AND x.tenant = ts.tenant)::int - (
               SELECT coalesce(sum(x.slots), 0) FROM {schema}.claim_budgets x
               WHERE x.queue = ts.queue AND x.tenant = ts.tenant)::int AS running,
           ts.max_running, ts.rate,
           coalesce(ts.tenant_group, 'default') AS tenant_group,
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
               AND EXISTS (SELECT FROM {schema}.jobs j
                           WHERE j.queue = ts.queue AND j.tenant = ts.tenant
                             AND j.status = 'queued' AND j.run_at <= now()) AS comp,
           b.*
    FROM {schema}.tenant_schedule ts
    CROSS JOIN LATERAL (
        SELECT count(*)::int AS queued, count(*) FILTER (WHERE j.run_at <= now())::int AS due,
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
v AS (
    SELECT r.*,
           count(*) FILTER (WHERE r.comp) OVER qo - r.comp::int AS ahead,
           count(*) FILTER (WHERE r.comp) OVER go - r.comp::int AS ahead_same,
           sum(r.running) OVER g AS group_running,
           sum(r.eff) FILTER (WHERE r.active) OVER g
               / nullif(sum(r.eff) FILTER (WHERE r.active) OVER q, 0) AS group_share,
           sum(r.running) OVER q AS queue_running,
           min(r.tenant_group) FILTER (WHERE r.active) OVER q
               < max(r.tenant_group) FILTER (WHERE r.active) OVER q AS groups
    FROM r
    -- (vtime, tenant) is unique in a queue: the default frame of an ordered window ends at the
    -- row itself.
    WINDOW q AS (PARTITION BY r.queue), qo AS (q ORDER BY r.vtime, r.tenant),
           g AS (PARTITION BY r.queue, r.tenant_group), go AS (g ORDER BY r.vtime, r.tenant)
),
-- The workers serving each queue read: alive while seen within %(missed_beats)s of their beats.
w AS (
    SELECT q.queue, count(*) FILTER (WHERE w.alive)::int AS workers,
           coalesce(array_agg(DISTINCT w.policy ORDER BY w.policy) FILTER (WHERE w.alive),
                    '{{}}') AS policies,
           max(w.seen_at) FILTER (WHERE NOT w.alive) AS last_worker_seen_at
    FROM (SELECT DISTINCT r.queue FROM r) q
    LEFT JOIN (SELECT w.queues, w.policy, w.seen_at, w.seen_at >= now()
                      - make_interval(secs => w.beat_seconds * %(missed_beats)s::float8) AS alive
               FROM {schema}.workers w) w ON q.queue = ANY (w.queues)
    GROUP BY q.queue
)
-- The reason: the first that holds, in docs/explain.md's order (`wait_reason`).
SELECT v.queue, v.tenant,
       {schema}.wait_reason(v.queued, v.running, w.workers, v.max_running, v.dry, v.token_due,
           v.next_run_at, v.due,
           v.comp AND v.ahead > v.ahead_same AND v.groups AND v.queue_running > 0
               AND v.group_running >= v.group_share * v.queue_running) AS reason,
       v.queued, v.due, v.running, v.max_running, v.rate, v.tokens, v.tenant_group,
       NOT EXISTS (SELECT FROM {schema}.tenants t WHERE t.tenant = v.tenant) AS cap_is_default,
       CASE WHEN v.due = 0 THEN v.next_run_at END AS next_due_at,
       CASE WHEN v.dry THEN v.token_due END AS next_token_at,
       CASE WHEN v.comp THEN v.ahead ELSE 0 END::int AS ahead,
       CASE WHEN v.comp THEN v.ahead - v.ahead_same ELSE 0 END::int AS ahead_other_groups,
       v.group_running::int, v.group_share, v.queue_running::int, w.workers, w.policies,
       w.last_worker_seen_at, now() AS checked_at
FROM v JOIN w ON w.queue = v.queue
WHERE v.asked
ORDER BY v.queue, v.tenant;
