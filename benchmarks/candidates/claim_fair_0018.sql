-- The fair claim statement of migrations up to 0018 (fairq/sql/claim.sql at b66abd3), for
-- comparisons with the function that replaced it (engine_v12.sql, migration 0019): every step
-- a CTE, due_after_job asked for the tenant the batch cut short, claim_settle given the stop.
-- It calls functions that stay in the database for workers of that release, so it runs on a
-- schema at head. Use: claim_pair.py --variant stmt=benchmarks/candidates/claim_fair_0018.sql
WITH
sleepers AS MATERIALIZED (
    SELECT s.ctid, s.tenant, ({schema}.claim_terms(s)).*  -- weight, room
    FROM {schema}.tenant_schedule s
    WHERE s.queue = %(queue)s AND NOT s.active AND s.wake_at <= now() AND NOT %(wait)s
    ORDER BY s.wake_at
    FOR NO KEY UPDATE OF s SKIP LOCKED
),
reach AS MATERIALIZED (
    SELECT ts.vtime + %(window)s AS hi FROM {schema}.tenant_schedule ts
    WHERE ts.queue = %(queue)s AND ts.active AND ts.running < ts.max_running
    ORDER BY ts.vtime LIMIT 1
),
cand AS (
    (SELECT 0 AS part, sl.ctid, sl.tenant, NULL::float8 AS vtime,
            CASE WHEN %(by_weight)s THEN sl.weight ELSE 1.0 END AS w, sl.room, NULL AS rn
     FROM sleepers sl WHERE sl.room > 0 ORDER BY sl.tenant)
    UNION ALL
    SELECT 1, r.ctid, r.tenant, r.vtime, r.w, r.room, row_number() OVER () FROM (
        SELECT ts.ctid, ts.tenant, ts.vtime,
               CASE WHEN %(by_weight)s
                    THEN ts.weight * coalesce((SELECT factor FROM {schema}.group_schedule
                                               WHERE queue = ts.queue
                                                 AND tenant_group = coalesce(ts.tenant_group, 'default')), 1.0)
                    ELSE 1.0 END AS w,
               {schema}.claim_room(ts) AS room
        FROM {schema}.tenant_schedule ts
        WHERE ts.queue = %(queue)s AND ts.active AND ts.running < ts.max_running
          AND ts.vtime <= (SELECT r.hi FROM reach r) AND NOT %(wait)s
        ORDER BY ts.vtime, ts.tenant
        -- A bound the walk never reaches in practice (it stops with the batch), there so the
        -- planner reads the index in order instead of reading all of it and sorting.
        LIMIT 1000
        FOR NO KEY UPDATE OF ts SKIP LOCKED) r
),
taken AS MATERIALIZED (
    (SELECT j.id, c.part, c.ctid, c.tenant,
           CASE WHEN %(by_cost)s THEN j.cost ELSE 1.0 END / c.w AS inc, b.n AS most,
           false AS more, c.rn, j.k
    FROM cand c
    -- Step 3: the jobs that start within the window, at least one. Each counts 1/w of virtual
    -- time (drr: its first due job's cost / w); a sleeper starts at V, the first runnable
    -- tenant's vtime (`hi` - window), so a whole window, also when no tenant is runnable (no
    -- `hi`). OFFSET 0: computed once, for the pick and for `served`.
    CROSS JOIN LATERAL (
        SELECT least(c.room, greatest(1.0, coalesce(floor(
                  coalesce((SELECT r.hi FROM reach r) - c.vtime, %(window)s) * c.w
                  / CASE WHEN %(by_cost)s THEN
                        (SELECT f.cost FROM {schema}.jobs f
                         WHERE f.queue = %(queue)s AND f.tenant = c.tenant
                           AND f.status = 'queued' AND f.run_at <= now()
                         ORDER BY f.priority DESC, f.run_at, f.id LIMIT 1)
                    ELSE 1.0 END) + 1,
                  c.room)))::int AS n OFFSET 0) b
    -- k numbers a tenant's jobs in the queue's order (row_number() is computed row by row: it
    -- reads no job ahead of the LIMIT below, so it locks none that is not taken).
    CROSS JOIN LATERAL (
        SELECT p.id, p.cost, row_number() OVER () AS k FROM (
            SELECT q.id, q.cost
            FROM {schema}.jobs q
            WHERE q.queue = %(queue)s AND q.tenant = c.tenant
              AND q.status = 'queued' AND q.run_at <= now()
            ORDER BY q.priority DESC, q.run_at, q.id
            LIMIT b.n
            FOR UPDATE OF q SKIP LOCKED) p
    ) j
    LIMIT %(batch)s)
    UNION ALL
    -- Step 5, the wait (wait_and_pick: as many of its picked jobs as fit once its row is held,
    -- not bounded by the window, as the claim it waited for has just moved its vtime; `more`:
    -- it has a due job left).
    SELECT h.id, 2, h.row_, h.tenant, h.inc, NULL, h.more, NULL, NULL
    FROM {schema}.wait_and_pick(%(queue)s, %(batch)s::int, %(by_weight)s, %(by_cost)s) h
    WHERE %(wait)s OR pg_current_xact_id_if_assigned() IS NULL
),
claimed AS (
    UPDATE {schema}.jobs j
    SET status = 'running', attempts = j.attempts + 1, started_at = now(),
        locked_until = now() + make_interval(secs => j.lease_seconds), locked_by = %(worker)s
    WHERE j.id = ANY ((SELECT array_agg(t.id) FROM taken t)::bigint[])
    RETURNING j.id, j.queue, j.tenant, j.task, j.payload, j.attempts, j.max_attempts,
              j.lease_seconds, j.priority, j.cost, j.run_at, j.started_at, j.locked_until
),
stop AS MATERIALIZED (
    SELECT CASE WHEN t.rn > (SELECT count(DISTINCT l.rn) FROM taken l)
                THEN (SELECT o.vtime FROM {schema}.tenant_schedule o
                      WHERE o.queue = %(queue)s AND o.tenant = t.tenant) END AS v, t.tenant
    FROM taken t WHERE t.part = 1 AND (SELECT count(*) FROM taken) >= %(batch)s
    ORDER BY t.rn DESC LIMIT 1
),
served AS MATERIALIZED (
    SELECT t.ctid, t.tenant, count(*)::int AS n, sum(t.inc) AS inc,
           CASE WHEN max(t.part) = 2 THEN NOT bool_or(t.more)
                WHEN count(*) < max(t.most) AND t.tenant <> coalesce(
                    (SELECT st.tenant FROM stop st),
                    (SELECT max(l.tenant) FROM taken l HAVING count(*) >= %(batch)s), '')
                THEN true
                ELSE NOT {schema}.due_after_job(%(queue)s, t.tenant, (max(ARRAY[t.k, t.id]))[2])
                END AS emptied
    FROM taken t GROUP BY t.ctid, t.tenant
),
settled AS MATERIALIZED (
    SELECT {schema}.claim_settle(
        %(queue)s, (SELECT count(*) FROM claimed) < %(batch)s AND NOT %(wait)s,
        (SELECT r.hi FROM reach r), (SELECT st.v FROM stop st), (SELECT st.tenant FROM stop st),
        array(SELECT sv.ctid FROM served sv), array(SELECT sv.tenant FROM served sv),
        array(SELECT sv.n FROM served sv), array(SELECT sv.inc FROM served sv),
        array(SELECT sv.tenant FROM served sv WHERE sv.emptied),
        array(SELECT sl.ctid FROM sleepers sl), array(SELECT sl.tenant FROM sleepers sl)) AS n
)
SELECT c.* FROM claimed c
WHERE (SELECT st.n FROM settled st) IS NOT NULL
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
WHERE NOT %(wait)s AND NOT EXISTS (SELECT FROM claimed)
  AND pg_current_xact_id_if_assigned() IS NOT NULL;

