-- The operator console's reads (`fairq web`, fairq/store/console.py). Read-only, each in a
-- bounded transaction (stats_timeouts). The tenant list is paged on the server: the page is
-- chosen from tenant_schedule's own columns (cheap to sort and filter at 100,000 tenants), and
-- only the page's (queue, tenant) pairs get the costly columns (queued, oldest wait, reason,
-- share of recent claims), read by console_tenant_facts.

-- name: console_tenant_count
-- How many (queue, tenant) rows match the search: the pager's total.
SELECT count(*)::int AS total FROM {schema}.tenant_schedule ts
WHERE (%(search)s::text IS NULL OR strpos(lower(ts.tenant), lower(%(search)s::text)) > 0)
  AND (%(queue)s::text IS NULL OR ts.queue = %(queue)s::text);

-- name: console_tenant_page
-- One page of (queue, tenant) rows in the order asked (%(sort)s: tenant, queue, weight, cap,
-- running, group, rate; %(desc)s: descending), ties broken by (queue, tenant). Only columns of
-- the schedule row itself: no job is read here.
SELECT ts.queue, ts.tenant, ts.weight, ts.max_running, ts.running, ts.rate, ts.burst,
       coalesce(ts.tenant_group, 'default') AS tenant_group, ts.active, ts.vtime
FROM {schema}.tenant_schedule ts
WHERE (%(search)s::text IS NULL OR strpos(lower(ts.tenant), lower(%(search)s::text)) > 0)
  AND (%(queue)s::text IS NULL OR ts.queue = %(queue)s::text)
ORDER BY
    CASE WHEN NOT %(desc)s::bool THEN CASE %(sort)s::text
        WHEN 'weight' THEN ts.weight WHEN 'cap' THEN ts.max_running::float8
        WHEN 'running' THEN ts.running::float8 WHEN 'rate' THEN coalesce(ts.rate, 'Infinity')
        END END ASC,
    CASE WHEN %(desc)s::bool THEN CASE %(sort)s::text
        WHEN 'weight' THEN ts.weight WHEN 'cap' THEN ts.max_running::float8
        WHEN 'running' THEN ts.running::float8 WHEN 'rate' THEN coalesce(ts.rate, 'Infinity')
        END END DESC,
    CASE WHEN NOT %(desc)s::bool THEN CASE %(sort)s::text
        WHEN 'tenant' THEN ts.tenant WHEN 'queue' THEN ts.queue
        WHEN 'group' THEN coalesce(ts.tenant_group, 'default') END END ASC,
    CASE WHEN %(desc)s::bool THEN CASE %(sort)s::text
        WHEN 'tenant' THEN ts.tenant WHEN 'queue' THEN ts.queue
        WHEN 'group' THEN coalesce(ts.tenant_group, 'default') END END DESC,
    ts.queue, ts.tenant
LIMIT %(limit)s OFFSET %(offset)s;

-- name: console_tenant_queues
-- One tenant's schedule rows, one per queue it has had jobs in (the columns of the page).
SELECT ts.queue, ts.tenant, ts.weight, ts.max_running, ts.running, ts.rate, ts.burst,
       coalesce(ts.tenant_group, 'default') AS tenant_group, ts.active, ts.vtime
FROM {schema}.tenant_schedule ts
WHERE ts.tenant = %(tenant)s::text
ORDER BY ts.queue;

-- name: console_tenant_facts
-- For the page's (queue, tenant) pairs only (%(queues)s[i], %(tenants)s[i]): queued and due
-- jobs and the oldest due job (each tenant's own jobs by jobs_tenant_ready_idx), its running
-- jobs (`tenant_running`: less unfolded slot returns and unused slots counted ahead), the rate
-- bucket, whether it competes now, its share of the claims of the last %(window)s seconds in its
-- queue and its share of the weight of the queue's active tenants, the group facts, and the
-- reason (`wait_reason`, as explain.sql decides it). Per queue of the page: one
-- pass over its schedule rows' own columns (weights, running) and one over the jobs started in
-- the window. `ahead` is not counted here (it needs every tenant's jobs probed): group_at_share
-- omits tenant_waits' "a tenant of another group is ahead" test; the tenant page has the full
-- answer.
WITH p AS (
    SELECT x.queue, x.tenant FROM unnest(%(queues)s::text[], %(tenants)s::text[]) x(queue, tenant)
),
r AS MATERIALIZED (
    SELECT ts.queue, ts.tenant, ts.active, ts.max_running, ts.rate, ts.weight,
           coalesce(ts.tenant_group, 'default') AS tenant_group,
           {schema}.tenant_running(ts) AS running,
           {schema}.tenant_dry(ts) AS dry, {schema}.token_due(ts) AS token_due,
           {schema}.tenant_tokens(ts) AS tokens,
           ts.active AND ts.running < ts.max_running AND {schema}.claim_room(ts) > 0 AS room,
           b.*
    FROM p JOIN {schema}.tenant_schedule ts ON ts.queue = p.queue AND ts.tenant = p.tenant
    CROSS JOIN LATERAL (
        SELECT count(*)::int AS queued, count(*) FILTER (WHERE j.run_at <= now())::int AS due,
               min(j.run_at) AS next_run_at,
               min(j.run_at) FILTER (WHERE j.run_at <= now()) AS oldest_due
        FROM {schema}.jobs j
        WHERE j.queue = ts.queue AND j.tenant = ts.tenant AND j.status = 'queued') b
),
qs AS (
    SELECT s.queue, coalesce(s.tenant_group, 'default') AS tenant_group,
           sum(s.running) AS running,
           sum(s.weight) FILTER (WHERE s.active OR s.running > 0) AS w,
           coalesce(min(g.weight), 1.0) AS gw
    FROM {schema}.tenant_schedule s
    LEFT JOIN {schema}.tenant_groups g ON g.tenant_group = coalesce(s.tenant_group, 'default')
    WHERE s.queue IN (SELECT DISTINCT p.queue FROM p)
    GROUP BY 1, 2
),
-- A group's share of its queue: its weight among the groups with active tenants; a tenant's
-- share of weight: its part of its group's active weight times that (as tenant_stats).
qg AS (
    SELECT qs.*, sum(qs.running) OVER (PARTITION BY qs.queue) AS queue_running,
           count(*) FILTER (WHERE qs.w > 0) OVER (PARTITION BY qs.queue) AS groups,
           qs.gw / nullif(sum(qs.gw) FILTER (WHERE qs.w > 0) OVER (PARTITION BY qs.queue), 0)
               AS share
    FROM qs
),
c AS (
    SELECT j.queue, count(*) AS claims
    FROM {schema}.jobs j
    WHERE j.started_at >= now() - make_interval(secs => %(window)s::float8)
      AND j.queue IN (SELECT DISTINCT p.queue FROM p)
    GROUP BY j.queue
),
ct AS (
    SELECT j.queue, j.tenant, count(*)::int AS claims
    FROM {schema}.jobs j JOIN p ON p.queue = j.queue AND p.tenant = j.tenant
    WHERE j.started_at >= now() - make_interval(secs => %(window)s::float8)
    GROUP BY j.queue, j.tenant
),
w AS (
    SELECT q.queue, count(*) FILTER (WHERE w.seen_at >= now()
               - make_interval(secs => w.beat_seconds * %(missed_beats)s::float8))::int AS workers
    FROM (SELECT DISTINCT p.queue FROM p) q
    LEFT JOIN {schema}.workers w ON q.queue = ANY (w.queues)
    GROUP BY q.queue
)
SELECT r.queue, r.tenant,
       {schema}.wait_reason(r.queued, r.running, w.workers, r.max_running, r.dry, r.token_due,
           r.next_run_at, r.due,
           r.room AND qg.groups > 1 AND qg.queue_running > 0
               AND qg.running >= qg.share * qg.queue_running) AS reason,
       r.queued, r.due, r.running, r.tokens,
       extract(epoch FROM now() - r.oldest_due)::float8 AS oldest_wait_seconds,
       coalesce(ct.claims, 0) AS recent_claims,
       coalesce(ct.claims, 0)::float8 / nullif(c.claims, 0) AS claim_share,
       CASE WHEN r.due > 0 OR r.running > 0 THEN
           r.weight / nullif(qg.w, 0) * qg.share END AS weight_share
FROM r
JOIN w ON w.queue = r.queue
LEFT JOIN qg ON qg.queue = r.queue AND qg.tenant_group = r.tenant_group
LEFT JOIN c ON c.queue = r.queue
LEFT JOIN ct ON ct.queue = r.queue AND ct.tenant = r.tenant;

-- name: console_queues
-- Per queue: due, delayed, running, failed and cancelled jobs now; one pass over the jobs
-- table (like `fairq stats`), under the caller's statement timeout.
SELECT j.queue,
       count(*) FILTER (WHERE j.status = 'queued' AND j.run_at <= now())::int AS due,
       count(*) FILTER (WHERE j.status = 'queued' AND j.run_at > now())::int AS delayed,
       count(*) FILTER (WHERE j.status = 'running')::int AS running,
       count(*) FILTER (WHERE j.status = 'failed')::int AS failed,
       count(*) FILTER (WHERE j.status = 'done')::int AS done
FROM {schema}.jobs j
GROUP BY j.queue
ORDER BY j.queue;

-- name: console_rates
-- Jobs started and finished done per minute over the last %(minutes)s minutes (the jobs table
-- keeps started_at and finished_at until the pruner deletes a job): claims/s and done/s.
SELECT m.minute,
       (SELECT count(*) FROM {schema}.jobs j
        WHERE j.started_at >= m.minute AND j.started_at < m.minute + interval '1 minute')::int
           AS claims,
       (SELECT count(*) FROM {schema}.jobs j
        WHERE j.status = 'done' AND j.finished_at >= m.minute
          AND j.finished_at < m.minute + interval '1 minute')::int AS done
FROM generate_series(date_trunc('minute', now()) - make_interval(mins => %(minutes)s - 1),
                     date_trunc('minute', now()), interval '1 minute') m(minute)
ORDER BY m.minute;

-- name: console_last_minute
-- Jobs started, and jobs finished done, in the last 60 seconds: the overview's claims/s and
-- done/s now.
SELECT count(*) FILTER (WHERE j.started_at >= now() - interval '1 minute')::int AS claims,
       count(*) FILTER (WHERE j.status = 'done'
                          AND j.finished_at >= now() - interval '1 minute')::int AS done
FROM {schema}.jobs j
WHERE j.started_at >= now() - interval '1 minute'
   OR (j.status = 'done' AND j.finished_at >= now() - interval '1 minute');

-- name: console_workers
-- The worker registry: alive while seen within %(missed_beats)s of their beats.
SELECT w.worker_id, w.queues, w.policy, w.started_at, w.seen_at,
       w.seen_at >= now() - make_interval(secs => w.beat_seconds * %(missed_beats)s::float8)
           AS alive
FROM {schema}.workers w
ORDER BY w.worker_id;

-- name: console_tenant_history
-- One tenant's recent history from the jobs table (fairq keeps no other history): per bucket of
-- %(bucket)s seconds over the last %(buckets)s buckets, the mean wait (run_at to started_at) of
-- its jobs started then, and its share of the claims of each queue it has jobs in.
WITH b AS (
    SELECT to_timestamp(floor(extract(epoch FROM now()) / %(bucket)s::float8) * %(bucket)s::float8
                        - g * %(bucket)s::float8) AS at
    FROM generate_series(0, %(buckets)s - 1) g
),
j AS (
    SELECT j.tenant, j.started_at, extract(epoch FROM j.started_at - j.run_at)::float8 AS wait
    FROM {schema}.jobs j
    WHERE j.started_at >= (SELECT min(b.at) FROM b)
      AND j.queue IN (SELECT s.queue FROM {schema}.tenant_schedule s
                      WHERE s.tenant = %(tenant)s::text)
)
SELECT b.at,
       avg(j.wait) FILTER (WHERE j.tenant = %(tenant)s::text) AS wait_seconds,
       count(j.started_at) FILTER (WHERE j.tenant = %(tenant)s::text)::int AS claims,
       count(j.started_at)::int AS all_claims
FROM b LEFT JOIN j ON j.started_at >= b.at AND j.started_at < b.at
                      + make_interval(secs => %(bucket)s::float8)
GROUP BY b.at
ORDER BY b.at;
