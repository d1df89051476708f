-- Candidate, rejected (2026-12-04): claim_fair whose walk is one statement, the runnable tenants
-- joined (LEFT JOIN LATERAL ... LIMIT its share, FOR UPDATE SKIP LOCKED) to their due jobs under
-- a LIMIT of the batch's room, rows read by a plpgsql FOR loop; rounds when walked-past tenants
-- take the LIMIT's room. Measured against engine_v12's claim_fair in the same claim_pair.py runs
-- (benchmarks/RESULTS.md): cheaper at 8 one-job tenants a claim in some runs (-0.03 .. -0.06 ms),
-- dearer when one tenant fills the batch (+0.04 .. +0.09 ms): the walk's per-tenant statements go,
-- but its plpgsql bookkeeping per row and per claim costs about as much. Run:
--   claim_pair.py --setup benchmarks/candidates/set_walk.sql --variant set=benchmarks/candidates/set_walk_call.sql
--
-- What it is, as written for the engine before it was measured ({schema}: the schema):
--
-- engine_v12.sql walked the runnable tenants with a cursor, one FETCH (the tenant's row,
-- locked) and one pick statement (its jobs, locked) per tenant: two statements, each started
-- and ended by the executor, for every tenant a claim serves. A claim of 8 over one-job tenants
-- ran 16 of them and cost 0.11-0.16 ms more than fifo's claim, which reads the same rows in one
-- statement (benchmarks/RESULTS.md). Here the walk is one statement: the runnable tenants in
-- (vtime, tenant) order, each locked as the statement reaches it, joined to each one's due jobs
-- (LATERAL, LIMIT its share of the window), locked as they are read, under a LIMIT of the
-- batch's room. The executor reads a tenant only when the jobs before it did not fill the LIMIT
-- and stops reading when it is full, so the statement locks the rows the cursor and the picks
-- locked, no more: the same walk, the same definition (docs/algorithm.md), one statement.
--
-- Snapshots: each statement of a VOLATILE function takes a new one. What the walk decides rests
-- on the rows it locks, which a newer snapshot does not change; claim_settle (engine_v10.sql)
-- runs after this claim's UPDATE, as before. Same parameters and result as engine_v12's claim_fair.
CREATE OR REPLACE FUNCTION {schema}.candidate_set_walk(q text, lim int, by_weight bool, by_cost bool,
                                               win float8, waiting bool, wk text)
-- The claimed jobs' columns by name, not the jobs table's row type (engine_v12.sql says why).
RETURNS TABLE (id bigint, queue text, tenant text, task text, payload jsonb, attempts int,
               max_attempts int, lease_seconds int, priority smallint, cost float8,
               run_at timestamptz, started_at timestamptz, locked_until timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    sl_rows tid[] := '{}';
    sl_tenants text[] := '{}';
    sl_weights float8[] := '{}';
    sl_rooms int[] := '{}';
    hi float8;
    -- a sleeper, or a row of the walk (one per job taken, or one per tenant walked past)
    t_row tid;
    t_tenant text;
    t_vtime float8;
    t_w float8;
    t_n int;
    t_id bigint;
    t_u float8;
    t_p int;
    t_r timestamptz;
    c float8;
    n int;
    ids bigint[];
    units float8;
    more bool;
    -- a round of the walk: its LIMIT, the rows it gave, the key it ended at
    want int;
    got int;
    a_v float8 := '-Infinity';
    a_t text := '';
    a_incl bool := false;  -- the next round starts at a_t itself: the LIMIT cut it short
    a_k int := 0;          -- the jobs a_t gave already
    all_ids bigint[] := '{}';
    -- each tenant served, in order: its row, name, jobs taken, units taken (virtual time once
    -- divided by its weight), weight, the jobs its share allowed, whether the batch may
    -- have cut it short, and its last job's key in the queue's order
    s_rows tid[] := '{}';
    s_tenants text[] := '{}';
    s_n int[] := '{}';
    s_inc float8[] := '{}';
    s_w float8[] := '{}';
    s_cap int[] := '{}';
    s_cut bool[] := '{}';
    s_p int[] := '{}';
    s_r timestamptz[] := '{}';
    s_id bigint[] := '{}';
    m int := 0;
    s_empty text[] := '{}';
    took int := 0;
    retired int;
BEGIN
    IF NOT waiting THEN
        -- 1. Sleepers: idle tenants whose delayed jobs fell due, locked (in wake-up order).
        -- They rejoin at V, first in the walk (those with room, in tenant order), and
        -- claim_settle wakes them all.
        SELECT coalesce(array_agg(x.ctid ORDER BY x.tenant), '{}'),
               coalesce(array_agg(x.tenant ORDER BY x.tenant), '{}'),
               coalesce(array_agg(x.weight ORDER BY x.tenant), '{}'),
               coalesce(array_agg(x.room ORDER BY x.tenant), '{}')
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
        -- 3. The sleepers with room, each at V (a whole window), one pick each: its due jobs,
        -- each 1/w of virtual time (drr: its first due job's cost / w), at least one, up to its
        -- room and the batch's, in the queue's order, locked SKIP LOCKED. A sleeper left
        -- unserved is asked again by claim_settle, which wakes it.
        FOR sl IN 1 .. cardinality(sl_rows) LOOP
            EXIT WHEN took >= lim;
            CONTINUE WHEN sl_rooms[sl] <= 0;
            t_tenant := sl_tenants[sl];
            t_w := CASE WHEN by_weight THEN sl_weights[sl] ELSE 1.0 END;
            c := 1.0;
            IF by_cost THEN
                SELECT f.cost INTO c FROM {schema}.jobs f
                WHERE f.queue = q AND f.tenant = t_tenant
                  AND f.status = 'queued' AND f.run_at <= now()
                ORDER BY f.priority DESC, f.run_at, f.id LIMIT 1;
            END IF;
            n := least(sl_rooms[sl], greatest(1.0, coalesce(floor(win * t_w / c) + 1,
                                                            sl_rooms[sl])))::int;
            SELECT array_agg(p.id), sum(CASE WHEN by_cost THEN p.cost ELSE 1.0 END),
                   (array_agg(p.priority))[count(*)], (array_agg(p.run_at))[count(*)]
            INTO ids, units, t_p, t_r
            FROM (SELECT pj.id, pj.cost, pj.priority, pj.run_at FROM {schema}.jobs pj
                  WHERE pj.queue = q AND pj.tenant = t_tenant
                    AND pj.status = 'queued' AND pj.run_at <= now()
                  ORDER BY pj.priority DESC, pj.run_at, pj.id
                  LIMIT least(n, lim - took)
                  FOR UPDATE OF pj SKIP LOCKED) p;
            CONTINUE WHEN ids IS NULL;
            took := took + cardinality(ids);
            all_ids := all_ids || ids;
            m := m + 1;
            s_rows := s_rows || sl_rows[sl];
            s_tenants := s_tenants || t_tenant;
            s_n := s_n || cardinality(ids);
            s_inc := s_inc || units;
            s_w := s_w || t_w;
            s_cap := s_cap || n;
            s_cut := s_cut || (took >= lim);
            s_p := s_p || t_p;
            s_r := s_r || t_r;
            s_id := s_id || ids[cardinality(ids)];
        END LOOP;
        -- 4. The walk: the runnable tenants up to the reach, in (vtime, tenant) order, each
        -- locked as the statement reaches it, SKIP LOCKED (a tenant another claim holds is being
        -- served by it); from each, its due jobs that start within the window: n, each 1/w of
        -- virtual time (drr: its first due job's cost / w), at least one, up to its room, in the
        -- queue's order, locked SKIP LOCKED. The outer LIMIT is the batch's room: the statement
        -- stops there, having locked only what it returns. A tenant that gives nothing (nothing
        -- due, every due job held, no room) is one row without a job: walked past. Such rows
        -- take room under the LIMIT, so a full round that took less than the batch is followed
        -- by another, from the last tenant it read (below). The tenants' LIMIT is a bound the
        -- walk never reaches in practice, there so the planner reads the index in order.
        WHILE took < lim AND hi IS NOT NULL LOOP
            want := lim - took;
            got := 0;
            FOR t_row, t_tenant, t_vtime, t_w, t_n, t_id, t_u, t_p, t_r IN
                SELECT w.ctid, w.tenant, w.vtime, w.w, w.n, j.id,
                       CASE WHEN by_cost THEN j.cost ELSE 1.0 END, j.priority, j.run_at
                FROM (SELECT s.ctid, s.tenant, s.vtime, s.w,
                             greatest(0, least(s.room, greatest(1.0, coalesce(
                                 floor((hi - s.vtime) * s.w / s.c) + 1, 1))))::int AS n
                      FROM (SELECT ts.ctid, ts.tenant, ts.vtime,
                                   CASE WHEN by_weight
                                        THEN ts.weight * coalesce((
                                            SELECT g.factor FROM {schema}.group_schedule g
                                            WHERE g.queue = ts.queue
                                              AND g.tenant_group = coalesce(ts.tenant_group,
                                                                            'default')), 1.0)
                                        ELSE 1.0 END AS w,
                                   {schema}.claim_room(ts) AS room,
                                   CASE WHEN by_cost
                                        THEN (SELECT f.cost FROM {schema}.jobs f
                                              WHERE f.queue = q AND f.tenant = ts.tenant
                                                AND f.status = 'queued' AND f.run_at <= now()
                                              ORDER BY f.priority DESC, f.run_at, f.id LIMIT 1)
                                        ELSE 1.0 END AS c
                            FROM {schema}.tenant_schedule ts
                            WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
                              AND ts.vtime <= hi AND (ts.vtime, ts.tenant) >= (a_v, a_t)
                              AND (a_incl OR ts.tenant <> a_t)
                            ORDER BY ts.vtime, ts.tenant
                            LIMIT 1000
                            FOR NO KEY UPDATE OF ts SKIP LOCKED) s) w
                LEFT JOIN LATERAL (
                    SELECT pj.id, pj.cost, pj.priority, pj.run_at FROM {schema}.jobs pj
                    WHERE pj.queue = q AND pj.tenant = w.tenant
                      AND pj.status = 'queued' AND pj.run_at <= now()
                      -- this transaction's own locks do not make it skip the jobs it took
                      AND (NOT a_incl OR w.tenant <> a_t OR pj.id <> ALL (all_ids))
                    ORDER BY pj.priority DESC, pj.run_at, pj.id
                    LIMIT greatest(0, w.n - CASE WHEN a_incl AND w.tenant = a_t
                                                 THEN a_k ELSE 0 END)
                    FOR UPDATE OF pj SKIP LOCKED) j ON true
                LIMIT want
            LOOP
                got := got + 1;
                IF t_id IS NULL THEN
                    -- Walked past: claim_settle takes it out of the runnable set if, under its
                    -- lock, it has no due job or no token.
                    s_empty := s_empty || t_tenant;
                    CONTINUE;
                END IF;
                took := took + 1;
                all_ids := all_ids || t_id;
                -- A tenant's rows come together (a tenant read again continues its entry).
                IF m > 0 AND s_tenants[m] = t_tenant THEN
                    s_n[m] := s_n[m] + 1;
                    s_inc[m] := s_inc[m] + t_u;
                    s_p[m] := t_p;
                    s_r[m] := t_r;
                    s_id[m] := t_id;
                ELSE
                    m := m + 1;
                    s_rows := s_rows || t_row;
                    s_tenants := s_tenants || t_tenant;
                    s_n := s_n || 1;
                    s_inc := s_inc || t_u;
                    s_w := s_w || t_w;
                    s_cap := s_cap || t_n;
                    s_cut := s_cut || false;
                    s_p := s_p || t_p;
                    s_r := s_r || t_r;
                    s_id := s_id || t_id;
                END IF;
            END LOOP;
            EXIT WHEN got < want;  -- the walk found no more
            -- A full round that took less than the batch: it met tenants that gave nothing.
            -- The next starts after its last row's tenant, or at that tenant itself when the
            -- LIMIT cut it short of its share (it may give the rest).
            a_v := t_vtime;
            a_t := t_tenant;
            a_incl := false;
            IF t_id IS NOT NULL THEN
                s_cut[m] := true;
                a_incl := s_n[m] < s_cap[m];
                a_k := s_n[m];
            END IF;
        END LOOP;
        -- Each served tenant's virtual time (step 6), and whether it looks empty now (step 7;
        -- claim_settle decides it again under a lock): one that gave fewer jobs than its share
        -- allowed, and was not cut short by the batch, had no more. Else it is asked for a due
        -- job after the last one it gave, in the queue's order: two index reads that start there
        -- (the rest of its priority, then the lower ones), not one from the head of its queue,
        -- where the entries of every job claimed since the last VACUUM lie.
        FOR i IN 1 .. m LOOP
            s_inc[i] := s_inc[i] / s_w[i];
            IF s_n[i] < s_cap[i] AND NOT s_cut[i] THEN
                more := false;
            ELSE
                t_tenant := s_tenants[i];
                t_p := s_p[i];
                t_r := s_r[i];
                t_id := s_id[i];
                more := EXISTS (SELECT FROM {schema}.jobs j
                                WHERE j.queue = q AND j.tenant = t_tenant
                                  AND j.status = 'queued' AND j.run_at <= now()
                                  AND j.priority = t_p
                                  AND (j.run_at, j.id) > (t_r, t_id))
                        OR EXISTS (SELECT FROM {schema}.jobs j
                                   WHERE j.queue = q AND j.tenant = t_tenant
                                     AND j.status = 'queued' AND j.run_at <= now()
                                     AND j.priority < t_p);
            END IF;
            IF NOT more THEN
                s_empty := s_empty || s_tenants[i];
            END IF;
        END LOOP;
    END IF;

    IF took = 0 AND (waiting OR pg_current_xact_id_if_assigned() IS NULL) THEN
        -- 5. The wait: nothing was taken and this transaction holds no lock (every row the walk
        -- could have locked was held), or this is the store's second statement. wait_and_pick
        -- (engine_v9.sql) picks the due jobs of the first runnable tenant, waits for its row and
        -- says whether a due job is left; it serves one tenant.
        SELECT array_agg(h.id), (array_agg(h.row_))[1], (array_agg(h.tenant))[1],
               count(*)::int, sum(h.inc), bool_or(h.more)
        INTO ids, t_row, t_tenant, n, units, more
        FROM {schema}.wait_and_pick(q, lim, by_weight, by_cost) h;
        IF ids IS NOT NULL THEN
            took := cardinality(ids);
            all_ids := ids;
            s_rows := ARRAY[t_row];
            s_tenants := ARRAY[t_tenant];
            s_n := ARRAY[n];
            s_inc := ARRAY[units];
            IF NOT more THEN
                s_empty := ARRAY[t_tenant];
            END IF;
        END IF;
    END IF;

    IF took > 0 THEN
        -- The jobs go to the result now; the function goes on to settle.
        RETURN QUERY
        UPDATE {schema}.jobs cj
        SET status = 'running', attempts = cj.attempts + 1, started_at = now(),
            locked_until = now() + make_interval(secs => cj.lease_seconds), locked_by = wk
        WHERE cj.id = ANY (all_ids)
        RETURNING cj.id, cj.queue, cj.tenant, cj.task, cj.payload, cj.attempts, cj.max_attempts,
                  cj.lease_seconds, cj.priority, cj.cost, cj.run_at, cj.started_at,
                  cj.locked_until;
    END IF;

    -- 6 and 7. The tenants' counts and virtual times, the sleepers woken, and every tenant
    -- served or walked past that has no due job left taken out of the runnable set
    -- (engine_v10.sql).
    SELECT {schema}.claim_settle(q, false, NULL, NULL, NULL,
                                 s_rows, s_tenants, s_n, s_inc, s_empty, sl_rows, sl_tenants)
    INTO retired;
    IF took = 0 AND NOT waiting AND pg_current_xact_id_if_assigned() IS NOT NULL THEN
        -- Took nothing while holding a lock (a sleeper, a walked tenant with nothing due, or a
        -- row claim_settle retired): it could not wait. One row of NULLs tells the store to run
        -- it again with `waiting`, holding nothing.
        RETURN NEXT;  -- every column NULL
    END IF;
END
$$;
