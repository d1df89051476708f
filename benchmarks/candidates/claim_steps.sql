-- Candidate (not adopted): claim_fair's steps as one plpgsql function, each CTE of the
-- statement its own statement, so that a step a claim does not need is never started. A
-- correct claim (the same definition), but no cheaper: the walk's statement still holds most
-- of the plan. Use: claim_pair.py --setup benchmarks/candidates/claim_steps.sql
--   --variant steps=benchmarks/candidates/claim_steps_call.sql
CREATE FUNCTION {schema}.candidate_claim_steps(q text, lim int, by_weight bool, by_cost bool, win float8,
                                    waiting bool, wk text)
RETURNS SETOF {schema}.jobs
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    sl_rows tid[] := '{}';
    sl_tenants text[] := '{}';
    sl_weights float8[] := '{}';
    sl_rooms int[] := '{}';
    hi float8;
    got {schema}.jobs[];
    s_rows tid[] := '{}';
    s_tenants text[] := '{}';
    s_n int[] := '{}';
    s_inc float8[] := '{}';
    s_part int[] := '{}';
    s_rn bigint[] := '{}';
    s_most int[] := '{}';
    s_last bigint[] := '{}';
    s_more bool[] := '{}';
    s_empty text[] := '{}';
    took int;
    cut text;
    stop_at int;
    stop_v float8;
    stop_t text;
    walked int := 0;
    nothing {schema}.jobs;
BEGIN
    IF NOT waiting THEN
        -- 1. Sleepers: idle tenants whose delayed jobs fell due, locked; they rejoin at V, first
        -- in the walk (those with room), and claim_settle wakes them all.
        SELECT coalesce(array_agg(x.ctid), '{}'), coalesce(array_agg(x.tenant), '{}'),
               coalesce(array_agg(x.weight), '{}'), coalesce(array_agg(x.room), '{}')
        INTO sl_rows, sl_tenants, sl_weights, sl_rooms
        FROM (SELECT s.ctid, s.tenant, ({schema}.claim_terms(s)).*  -- weight, room
              FROM {schema}.tenant_schedule s
              WHERE s.queue = q AND NOT s.active AND s.wake_at <= now()
              ORDER BY s.wake_at
              FOR NO KEY UPDATE OF s SKIP LOCKED) x;
        -- 2. The walk's reach: one window of virtual time past the first runnable tenant.
        SELECT ts.vtime + win INTO hi FROM {schema}.tenant_schedule ts
        WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
        ORDER BY ts.vtime LIMIT 1;
        -- 3. The walk, the pick and the claim, in one statement (claim.sql's claim_fair up to
        -- 0018 explains each part): the sleepers with room in tenant order, then the runnable
        -- tenants in (vtime, tenant) order up to `hi`, each row locked as the walk reaches it,
        -- SKIP LOCKED, and numbered (rn; row_number() reads nothing ahead); each gives its due
        -- jobs that start within the window, at least one, up to its room, numbered in the
        -- queue's order (k); the walk stops when the batch is full.
        WITH cand AS (
            (SELECT 0 AS part, x.r AS row_, x.t AS tenant, NULL::float8 AS vtime,
                    CASE WHEN by_weight THEN x.w ELSE 1.0 END AS w, x.room, NULL::bigint AS rn
             FROM unnest(sl_rows, sl_tenants, sl_weights, sl_rooms) AS x(r, t, w, room)
             WHERE x.room > 0 ORDER BY x.t)
            UNION ALL
            SELECT 1, r.ctid, r.tenant, r.vtime, r.w, r.room, row_number() OVER () FROM (
                SELECT ts.ctid, ts.tenant, ts.vtime,
                       CASE WHEN by_weight
                            THEN ts.weight * coalesce((SELECT g.factor FROM {schema}.group_schedule g
                                                       WHERE g.queue = ts.queue
                                                         AND g.tenant_group = coalesce(ts.tenant_group, 'default')), 1.0)
                            ELSE 1.0 END AS w,
                       {schema}.claim_room(ts) AS room
                FROM {schema}.tenant_schedule ts
                WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
                  AND ts.vtime <= hi
                ORDER BY ts.vtime, ts.tenant
                -- A bound the walk never reaches in practice (it stops with the batch), there so
                -- the planner reads the index in order instead of reading all of it and sorting.
                LIMIT 1000
                FOR NO KEY UPDATE OF ts SKIP LOCKED) r
        ),
        taken AS MATERIALIZED (
            SELECT j.id, c.part, c.row_, c.tenant,
                   CASE WHEN by_cost THEN j.cost ELSE 1.0 END / c.w AS inc, b.n AS most, c.rn, j.k
            FROM cand c
            -- A sleeper starts at V (`hi` - window), so a whole window, also when no tenant is
            -- runnable (no `hi`). OFFSET 0: computed once.
            CROSS JOIN LATERAL (
                SELECT least(c.room, greatest(1.0, coalesce(floor(
                          coalesce(hi - c.vtime, win) * c.w
                          / CASE WHEN by_cost THEN
                                (SELECT f.cost FROM {schema}.jobs f
                                 WHERE f.queue = q AND f.tenant = c.tenant
                                   AND f.status = 'queued' AND f.run_at <= now()
                                 ORDER BY f.priority DESC, f.run_at, f.id LIMIT 1)
                            ELSE 1.0 END) + 1,
                          c.room)))::int AS n OFFSET 0) b
            CROSS JOIN LATERAL (
                SELECT p.id, p.cost, row_number() OVER () AS k FROM (
                    SELECT pj.id, pj.cost
                    FROM {schema}.jobs pj
                    WHERE pj.queue = q AND pj.tenant = c.tenant
                      AND pj.status = 'queued' AND pj.run_at <= now()
                    ORDER BY pj.priority DESC, pj.run_at, pj.id
                    LIMIT b.n
                    FOR UPDATE OF pj SKIP LOCKED) p
            ) j
            LIMIT lim
        ),
        claimed AS (
            UPDATE {schema}.jobs cj
            SET status = 'running', attempts = cj.attempts + 1, started_at = now(),
                locked_until = now() + make_interval(secs => cj.lease_seconds), locked_by = wk
            WHERE cj.id = ANY ((SELECT array_agg(t.id) FROM taken t)::bigint[])
            RETURNING cj
        ),
        served AS (
            SELECT t.row_, t.tenant, count(*)::int AS n, sum(t.inc) AS inc, max(t.part) AS part,
                   max(t.rn) AS rn, max(t.most) AS most,
                   -- the job its pick numbered last: the id of the highest k, without a sort
                   (max(ARRAY[t.k, t.id]))[2] AS last
            FROM taken t GROUP BY t.row_, t.tenant
        )
        SELECT (SELECT array_agg(c.cj) FROM claimed c),
               coalesce(array_agg(sv.row_), '{}'), coalesce(array_agg(sv.tenant), '{}'),
               coalesce(array_agg(sv.n), '{}'), coalesce(array_agg(sv.inc), '{}'),
               coalesce(array_agg(sv.part), '{}'), coalesce(array_agg(sv.rn), '{}'),
               coalesce(array_agg(sv.most), '{}'), coalesce(array_agg(sv.last), '{}')
        INTO got, s_rows, s_tenants, s_n, s_inc, s_part, s_rn, s_most, s_last
        FROM served sv;
    END IF;
    took := coalesce(cardinality(got), 0);

    IF took = 0 AND (waiting OR pg_current_xact_id_if_assigned() IS NULL) THEN
        -- 5. The wait (docs/algorithm.md, step 5): the walk took nothing and this transaction
        -- holds no lock (no transaction id: every row it could have locked was held), or this
        -- is the store's second statement. wait_and_pick (engine_v9.sql) picks the jobs of the
        -- first runnable tenant with a due job, waits for its row, and says whether a due job
        -- is left (`more`).
        WITH h AS MATERIALIZED (
            SELECT * FROM {schema}.wait_and_pick(q, lim, by_weight, by_cost)
        ),
        claimed AS (
            UPDATE {schema}.jobs cj
            SET status = 'running', attempts = cj.attempts + 1, started_at = now(),
                locked_until = now() + make_interval(secs => cj.lease_seconds), locked_by = wk
            WHERE cj.id = ANY ((SELECT array_agg(h.id) FROM h)::bigint[])
            RETURNING cj
        ),
        served AS (
            SELECT h.row_, h.tenant, count(*)::int AS n, sum(h.inc) AS inc, bool_or(h.more) AS more
            FROM h GROUP BY h.row_, h.tenant
        )
        SELECT (SELECT array_agg(c.cj) FROM claimed c),
               coalesce(array_agg(sv.row_), '{}'), coalesce(array_agg(sv.tenant), '{}'),
               coalesce(array_agg(sv.n), '{}'), coalesce(array_agg(sv.inc), '{}'),
               coalesce(array_agg(sv.tenant) FILTER (WHERE NOT sv.more), '{}')
        INTO got, s_rows, s_tenants, s_n, s_inc, s_empty
        FROM served sv;
        took := coalesce(cardinality(got), 0);
    ELSIF took > 0 THEN
        -- 4. Where the walk stopped, if the batch is full: the tenant it cut short (the walked
        -- tenant with the highest walk number; with none, the last sleeper). Its key in the
        -- runnable index goes to claim_settle only when the walk went past a row it locked
        -- without serving it (the stop's number is past the count of tenants it served);
        -- claim_settle then reads the tenants before the stop for those.
        IF took >= lim THEN
            FOR i IN 1 .. cardinality(s_rows) LOOP
                IF s_part[i] = 1 THEN
                    walked := walked + 1;
                    IF stop_at IS NULL OR s_rn[i] > s_rn[stop_at] THEN
                        stop_at := i;
                    END IF;
                END IF;
            END LOOP;
            IF stop_at IS NOT NULL THEN
                cut := s_tenants[stop_at];
                stop_t := cut;
                IF s_rn[stop_at] > walked THEN
                    SELECT o.vtime INTO stop_v FROM {schema}.tenant_schedule o
                    WHERE o.ctid = s_rows[stop_at];
                END IF;
            ELSE
                SELECT max(x) INTO cut FROM unnest(s_tenants) x;
            END IF;
        END IF;
        -- Per served tenant, whether it looks empty now (claim_settle decides it again under a
        -- lock): one that gave fewer jobs than its pick allowed had no more, unless the batch
        -- cut it short; the one cut short, or one that gave all its pick allowed, is asked for a
        -- due job after the last one it gave (due_after_job, engine_v11.sql).
        FOR i IN 1 .. cardinality(s_rows) LOOP
            IF (s_n[i] < s_most[i] AND s_tenants[i] IS DISTINCT FROM cut)
               OR NOT {schema}.due_after_job(q, s_tenants[i], s_last[i]) THEN
                s_empty := s_empty || s_tenants[i];
            END IF;
        END LOOP;
    END IF;

    -- 6. The tenants' counts and virtual times, the sleepers woken, and every tenant served or
    -- walked past that has no due job left taken out of the runnable set.
    PERFORM {schema}.claim_settle(q, took < lim AND NOT waiting, hi, stop_v, stop_t,
                                  s_rows, s_tenants, s_n, s_inc, s_empty, sl_rows, sl_tenants);
    IF took > 0 THEN
        RETURN QUERY SELECT * FROM unnest(got);
    ELSIF NOT waiting AND pg_current_xact_id_if_assigned() IS NOT NULL THEN
        -- Took nothing while holding a lock (a sleeper, a walked tenant with nothing due, or a
        -- row claim_settle retired): it could not wait. One row of NULLs tells the store to
        -- run it again with `waiting`, holding nothing.
        RETURN NEXT nothing;
    END IF;
END
$$;
