-- The fair engine's functions, version 13 (migration 0020): claim_fair (engine_v12.sql) and
-- claim_settle (engine_v10.sql) replaced in place, same signatures and results, doing the same
-- steps with less of PostgreSQL's per-execution work. {schema} is the quoted schema name.
-- Never edit this file once released; a change is a new file and a new migration.
--
-- Over tenants with one due job each, a fair claim of 8 walks 8 tenants where fifo's one
-- statement takes 8 jobs, and cost 0.11-0.36 ms more than fifo's (claim_pair.py). Much of
-- that was a price each statement pays at every execution whatever it reads, and paid once per
-- tenant walked: claim_fair's pick of a tenant's jobs aggregated them into five values (an
-- ARRAY subquery of their ids costs about 0.01 ms less a tenant); the sleepers' read built four
-- ordered aggregates at every claim, nearly always over no row; claim_settle ran four
-- statements where such a claim needs one (two to find and lock the rows it retires, the
-- sleepers' wake-up with no sleeper, the suspects' read with none to suspect).
-- Here: the pick is an ARRAY subquery (drr, which needs its jobs' costs, one aggregate);
-- the sleepers are locked by an ARRAY subquery and their terms read only when there are any;
-- claim_settle finds the rows to retire in the statement that locks them, wakes sleepers only
-- when there are some, and ends on plain expressions when there is nothing to suspect.
-- What a claim decides is unchanged (docs/algorithm.md).

CREATE OR REPLACE FUNCTION {schema}.claim_settle(
    q text, short bool, hi float8, stop_v float8, stop_t text,
    s_rows tid[], s_tenants text[], s_n int[], s_inc float8[], s_empty text[],
    w_rows tid[], w_tenants text[]
) RETURNS int
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v float8;
    dry text[];
    suspects text[];
    locked tid[];
    retired int;
    gone tid[] := '{}';
    done text[];
BEGIN
    IF {schema}.groups_due(q) THEN
        PERFORM {schema}.refresh_groups(q);
    END IF;
    IF cardinality(w_rows) > 0 THEN
        v := {schema}.queue_vtime(q);  -- before any sleeper is active
    END IF;
    -- As in v4, a served tenant without a rate limit that looked empty is retired by the same row
    -- write that counts its jobs. Its row is locked FOR UPDATE first, SKIP LOCKED: that lock
    -- conflicts with an enqueue's FOR KEY SHARE, so a tenant an open enqueue is adding a job to
    -- is skipped (it stays runnable), and an enqueue that comes later waits for this claim and
    -- then sees the tenant idle and wakes it. The UPDATE's snapshot is taken after the lock, so
    -- it sees every job an enqueue committed before it.
    IF cardinality(s_empty) > 0 THEN
        -- By ctid alone (a Tid Scan): the rows this claim holds cannot move. v13: the served
        -- rows whose tenant looked empty are picked out of s_rows inside the statement that
        -- locks them (v10 ran a statement of its own for it first). Not by `ts.tenant = ANY
        -- (s_empty)`: the planner reads that through tenant_schedule_pkey, every tenant of
        -- every queue, instead of the rows' ctids.
        gone := array(SELECT ts.ctid FROM {schema}.tenant_schedule ts
                      WHERE ts.ctid = ANY (array(SELECT x.r FROM unnest(s_rows, s_tenants) AS x(r, t)
                                                 WHERE x.t = ANY (s_empty)))
                        AND ts.rate IS NULL
                      FOR UPDATE OF ts SKIP LOCKED);
    END IF;
    -- Served tenants (a sleeper among them wakes at V here); then the sleepers not served,
    -- whose rows are unchanged. Only by ctid: a condition on `active` would let the planner
    -- read the idle tenants' index for it.
    WITH u AS (
        UPDATE {schema}.tenant_schedule ts
        SET running = ts.running + x.n, claimed_total = ts.claimed_total + x.n,
            vtime = CASE WHEN x.row_ = ANY (w_rows) THEN v ELSE ts.vtime END + x.inc,
            active = NOT x.retire AND (ts.active OR x.row_ = ANY (w_rows)),
            -- retired, it waits for its earliest delayed job, if any.
            wake_at = CASE WHEN x.retire THEN x.first_at
                           WHEN x.row_ = ANY (w_rows) THEN NULL ELSE ts.wake_at END,
            tokens = {schema}.tenant_tokens(ts) - x.n,
            refilled_at = CASE WHEN ts.rate IS NOT NULL THEN now() END,
            -- served, so it has had a token since token_at: the interval ends there.
            throttled_seconds = ts.throttled_seconds + {schema}.throttled_open(ts),
            throttled_since = NULL,
            last_served_at = now()
        -- v5: one read of the tenant's queued jobs, their earliest run_at, decides both (v4
        -- read them twice: for a due one, then for the earliest). OFFSET 0 keeps the planner
        -- from copying the subquery into both of its uses.
        FROM (SELECT z.*, z.row_ = ANY (gone) AND (z.first_at IS NULL OR z.first_at > now())
                          AS retire
              FROM (SELECT y.row_, y.n, y.inc,
                           CASE WHEN y.row_ = ANY (gone) THEN
                               (SELECT min(j.run_at) FROM {schema}.jobs j
                                WHERE j.queue = q AND j.tenant = y.t AND j.status = 'queued')
                           END AS first_at
                    FROM unnest(s_rows, s_tenants, s_n, s_inc) AS y(row_, t, n, inc)
                    OFFSET 0) z) x
        WHERE ts.ctid = x.row_
        RETURNING ts.tenant, ts.rate IS NOT NULL AND ts.tokens + 1e-9 < 1 AS dry, NOT ts.active AS out
    )
    SELECT coalesce(array_agg(u.tenant) FILTER (WHERE u.dry), '{}'),
           coalesce(array_agg(u.tenant) FILTER (WHERE u.out), '{}')
    INTO dry, done FROM u;
    IF cardinality(w_rows) > 0 THEN  -- v13: only when there are sleepers
        UPDATE {schema}.tenant_schedule ts
        SET active = true, wake_at = NULL, vtime = v
        WHERE ts.ctid = ANY (array(SELECT r FROM unnest(w_rows) r WHERE r <> ALL (s_rows)));
    END IF;

    -- Suspects: served and looking empty (unless retired above) or left dry, sleepers it did
    -- not serve, and the runnable tenants its walk went past (held by other claims, with
    -- nothing due, or dry). v13: when there can be none (the common claim: every tenant that
    -- looked empty retired above, none dry, every sleeper served, no range to read), the claim
    -- ends here, decided by plain expressions rather than by a statement building an empty
    -- array.
    IF s_empty <@ done AND cardinality(dry) = 0 AND w_tenants <@ s_tenants
       AND stop_v IS NULL AND NOT (short AND hi IS NOT NULL) THEN
        RETURN 0;
    END IF;
    suspects := array(SELECT x FROM unnest(s_empty) x WHERE x <> ALL (done)) || dry
                || array(SELECT x FROM unnest(w_tenants) x WHERE x <> ALL (s_tenants));
    IF stop_v IS NOT NULL THEN
        -- v10: the runnable tenants before the stop in (vtime, tenant) order, read in one range
        -- backwards from it, 1,000 at most: the walk visits at most 1,000 tenants, so when the
        -- stop is where the walk was these are every tenant it went past. The stop is read from
        -- the rows the walk locked, and a row another claim updated since this claim's snapshot
        -- is locked as it is now (READ COMMITTED follows the update), so with concurrent
        -- claimers it can lie past where the walk was: the bound keeps that case at 1,000
        -- probes (without one, 10,000 tenants were locked and probed in one claim). A suspect is
        -- retired only after a probe under its lock: which tenants are suspected changes what a
        -- claim reads, never what is right. The backward read starts at the stop's key and ends
        -- after 1,000 rows in every statistics state; v5's two forward ranges had one (`vtime =
        -- stop_v AND tenant < stop_t ORDER BY tenant`) that the planner read by the primary key
        -- when tenant_schedule's statistics said it held one row, and a forward read of this
        -- range does not end at the stop on PostgreSQL 15.
        suspects := suspects || array(
            SELECT w.tenant FROM (
                SELECT ts.tenant FROM {schema}.tenant_schedule ts
                WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
                  AND (ts.vtime, ts.tenant) < (stop_v, stop_t)
                ORDER BY ts.vtime DESC, ts.tenant DESC LIMIT 1000) w
            WHERE w.tenant <> ALL (s_tenants));
    ELSIF short AND hi IS NOT NULL THEN
        suspects := suspects || array(
            SELECT w.tenant FROM (
                SELECT ts.tenant FROM {schema}.tenant_schedule ts
                WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
                  AND ts.vtime <= hi
                ORDER BY ts.vtime, ts.tenant LIMIT 1000) w
            WHERE w.tenant <> ALL (s_tenants));
    END IF;
    IF cardinality(suspects) = 0 THEN
        RETURN 0;
    END IF;

    SELECT array_agg(x.ctid) INTO locked
    FROM (SELECT DISTINCT u.t FROM unnest(suspects) AS u(t) ORDER BY u.t) u
    CROSS JOIN LATERAL (
        SELECT ts.ctid FROM {schema}.tenant_schedule ts
        WHERE ts.queue = q AND ts.tenant = u.t AND ts.active
          AND ({schema}.tenant_dry(ts)
               OR (SELECT true FROM {schema}.jobs j
                   WHERE j.queue = q AND j.tenant = u.t AND j.status = 'queued'
                     AND j.run_at <= now() LIMIT 1) IS NULL)
        FOR UPDATE OF ts SKIP LOCKED) x;
    IF locked IS NULL THEN
        RETURN 0;
    END IF;
    -- The fresh snapshot: retire those that still have no due job, or no token.
    UPDATE {schema}.tenant_schedule ts
    SET active = false,
        wake_at = (SELECT greatest(j.run_at, {schema}.token_due(ts)) FROM {schema}.jobs j
                   WHERE j.queue = ts.queue AND j.tenant = ts.tenant AND j.status = 'queued'
                   ORDER BY j.run_at LIMIT 1),
        -- retired dry with a queued job: throttled from now, or from that job's run_at if
        -- later, unless an interval is open already (woken early, dry again). Retired without
        -- a queued job, or with a token: the open interval, if any, is credited and closed.
        throttled_seconds = ts.throttled_seconds + CASE
            WHEN ts.throttled_since IS NULL THEN 0.0
            WHEN {schema}.tenant_dry(ts)
                 AND (SELECT true FROM {schema}.jobs j
                      WHERE j.queue = ts.queue AND j.tenant = ts.tenant
                        AND j.status = 'queued' LIMIT 1) THEN 0.0
            ELSE {schema}.throttled_open(ts) END,
        throttled_since = CASE WHEN {schema}.tenant_dry(ts) THEN
            (SELECT least(ts.throttled_since, greatest(now(), j.run_at)) FROM {schema}.jobs j
             WHERE j.queue = ts.queue AND j.tenant = ts.tenant AND j.status = 'queued'
             ORDER BY j.run_at LIMIT 1) END
    WHERE ts.ctid = ANY (locked)
      AND ({schema}.tenant_dry(ts)
           OR (SELECT true FROM {schema}.jobs j
               WHERE j.queue = ts.queue AND j.tenant = ts.tenant AND j.status = 'queued'
                 AND j.run_at <= now() LIMIT 1) IS NULL);
    GET DIAGNOSTICS retired = ROW_COUNT;
    RETURN retired;
END
$$;

CREATE OR REPLACE FUNCTION {schema}.claim_fair(q text, lim int, by_weight bool, by_cost bool, win float8,
                                    waiting bool, wk text)
-- It returns the claimed jobs' columns by name, not the jobs table's row type: a plpgsql
-- function caches the row type its statements were first planned with, and a newer release's
-- migration that adds a column to jobs would then break every claim of a running worker
-- ("structure of query does not match function result type"). `use_column`: where a name is
-- both one of these columns and a table's column, the body means the table's.
RETURNS TABLE (id bigint, queue text, tenant text, task text, payload jsonb, attempts int,
               max_attempts int, lease_seconds int, priority smallint, cost float8,
               run_at timestamptz, started_at timestamptz, locked_until timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    -- The runnable tenants up to the reach, in (vtime, tenant) order, each locked as a FETCH
    -- reaches it, SKIP LOCKED (a tenant another claim holds is being served by it). LIMIT: a
    -- bound the walk never reaches in practice, there so the planner reads the index in order.
    walk NO SCROLL CURSOR (hi_ float8) FOR
        SELECT ts.ctid, ts.tenant, ts.vtime,
               CASE WHEN by_weight
                    THEN ts.weight * coalesce((SELECT g.factor FROM {schema}.group_schedule g
                                               WHERE g.queue = ts.queue
                                                 AND g.tenant_group = coalesce(ts.tenant_group, 'default')), 1.0)
                    ELSE 1.0 END,
               {schema}.claim_room(ts)
        FROM {schema}.tenant_schedule ts
        WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running AND ts.vtime <= hi_
        ORDER BY ts.vtime, ts.tenant
        LIMIT 1000
        FOR NO KEY UPDATE OF ts SKIP LOCKED;
    walking bool := false;
    sl_rows tid[] := '{}';
    sl_tenants text[] := '{}';
    sl_weights float8[] := '{}';
    sl_rooms int[] := '{}';
    sl int := 0;
    hi float8;
    -- the candidate in hand
    t_row tid;
    t_tenant text;
    t_vtime float8;
    t_w float8;
    t_room int;
    c float8;
    n int;
    ids bigint[];
    units float8;
    more bool;
    all_ids bigint[] := '{}';
    s_rows tid[] := '{}';
    s_tenants text[] := '{}';
    s_n int[] := '{}';
    s_inc float8[] := '{}';
    s_empty text[] := '{}';
    took int := 0;
    retired int;
BEGIN
    IF NOT waiting THEN
        -- 1. Sleepers: idle tenants whose delayed jobs fell due, locked (in wake-up order).
        -- They rejoin at V, first in the walk (those with room, in tenant order), and
        -- claim_settle wakes them all. v13: their rows are locked by an ARRAY subquery, and
        -- their terms read by a second statement only when there are any (v12 built four
        -- ordered aggregates at every claim, most of which find no sleeper).
        sl_rows := ARRAY(SELECT s.ctid FROM {schema}.tenant_schedule s
                         WHERE s.queue = q AND NOT s.active AND s.wake_at <= now()
                         ORDER BY s.wake_at
                         FOR NO KEY UPDATE OF s SKIP LOCKED);
        IF cardinality(sl_rows) > 0 THEN
            SELECT array_agg(x.ctid ORDER BY x.tenant), array_agg(x.tenant ORDER BY x.tenant),
                   array_agg(x.weight ORDER BY x.tenant), array_agg(x.room ORDER BY x.tenant)
            INTO sl_rows, sl_tenants, sl_weights, sl_rooms
            FROM (SELECT s.ctid, s.tenant, ({schema}.claim_terms(s)).*  -- weight, room
                  FROM {schema}.tenant_schedule s WHERE s.ctid = ANY (sl_rows)) x;
        END IF;
        -- 2. The walk's reach: one window of virtual time past the first runnable tenant.
        SELECT ts.vtime + win INTO hi FROM {schema}.tenant_schedule ts
        WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
        ORDER BY ts.vtime LIMIT 1;
        -- 3. The candidates, the sleepers with room and then the walk, until the batch is full.
        WHILE took < lim LOOP
            IF NOT walking THEN
                sl := sl + 1;
                IF sl > cardinality(sl_rows) THEN
                    EXIT WHEN hi IS NULL;  -- no runnable tenant
                    OPEN walk(hi);
                    walking := true;
                    CONTINUE;
                END IF;
                CONTINUE WHEN sl_rooms[sl] <= 0;
                -- A sleeper starts at V (`hi` - window): a whole window, also when no tenant
                -- is runnable (no `hi`).
                t_row := sl_rows[sl];
                t_tenant := sl_tenants[sl];
                t_vtime := NULL;
                t_w := CASE WHEN by_weight THEN sl_weights[sl] ELSE 1.0 END;
                t_room := sl_rooms[sl];
            ELSE
                FETCH walk INTO t_row, t_tenant, t_vtime, t_w, t_room;
                EXIT WHEN NOT FOUND;
            END IF;
            -- 4. Its due jobs that start within the window: each counts 1/w of virtual time
            -- (drr: its first due job's cost / w), at least one, up to its room; in the queue's
            -- order, locked SKIP LOCKED, no more than the batch has room for.
            c := 1.0;
            IF by_cost THEN
                SELECT f.cost INTO c FROM {schema}.jobs f
                WHERE f.queue = q AND f.tenant = t_tenant
                  AND f.status = 'queued' AND f.run_at <= now()
                ORDER BY f.priority DESC, f.run_at, f.id LIMIT 1;
            END IF;
            n := least(t_room, greatest(1.0, coalesce(
                     floor(coalesce(hi - t_vtime, win) * t_w / c) + 1, t_room)))::int;
            -- v13: an ARRAY subquery, not an aggregate. v12 aggregated the picked rows (the
            -- ids, the units and the last job's key: five aggregates), at every tenant walked;
            -- the ARRAY costs about 0.01 ms less a tenant (claim_pair.py). Each job counts 1,
            -- so the units are the count; drr sums its jobs' costs with one aggregate. The
            -- check below reads the last job's key by id.
            IF by_cost THEN
                SELECT coalesce(array_agg(p.id), '{}'), sum(p.cost) INTO ids, units
                FROM (SELECT pj.id, pj.cost FROM {schema}.jobs pj
                      WHERE pj.queue = q AND pj.tenant = t_tenant
                        AND pj.status = 'queued' AND pj.run_at <= now()
                      ORDER BY pj.priority DESC, pj.run_at, pj.id
                      LIMIT least(n, lim - took)
                      FOR UPDATE OF pj SKIP LOCKED) p;
            ELSE
                ids := ARRAY(SELECT pj.id FROM {schema}.jobs pj
                             WHERE pj.queue = q AND pj.tenant = t_tenant
                               AND pj.status = 'queued' AND pj.run_at <= now()
                             ORDER BY pj.priority DESC, pj.run_at, pj.id
                             LIMIT least(n, lim - took)
                             FOR UPDATE OF pj SKIP LOCKED);
                units := cardinality(ids);
            END IF;
            IF cardinality(ids) = 0 THEN
                -- Walked past (nothing due, every due job held by another claim, or no room):
                -- claim_settle takes it out of the runnable set if, under its lock, it has no
                -- due job or no token. A sleeper left unserved is asked the same.
                IF walking THEN
                    s_empty := s_empty || t_tenant;
                END IF;
                CONTINUE;
            END IF;
            took := took + cardinality(ids);
            all_ids := all_ids || ids;
            s_rows := s_rows || t_row;
            s_tenants := s_tenants || t_tenant;
            s_n := s_n || cardinality(ids);
            s_inc := s_inc || (units / t_w);
            -- Whether it looks empty now (step 7; claim_settle decides it again under a lock):
            -- one that gave fewer jobs than its pick allowed, and was not cut short by the
            -- batch, had no more. Else it is asked for a due job after the last one it gave, in
            -- the queue's order: two index reads that start there (the rest of its priority,
            -- then the lower ones), not one from the head of its queue, which the pick has just
            -- read past and where the entries of every job claimed since the last VACUUM lie.
            -- (The last job's key comes from its row, `l`, by primary key.)
            IF cardinality(ids) < n AND took < lim THEN
                more := false;
            ELSE
                more := EXISTS (SELECT FROM {schema}.jobs l, {schema}.jobs j
                                WHERE l.id = ids[cardinality(ids)]
                                  AND j.queue = q AND j.tenant = t_tenant
                                  AND j.status = 'queued' AND j.run_at <= now()
                                  AND j.priority = l.priority
                                  AND (j.run_at, j.id) > (l.run_at, l.id))
                        OR EXISTS (SELECT FROM {schema}.jobs l, {schema}.jobs j
                                   WHERE l.id = ids[cardinality(ids)]
                                     AND j.queue = q AND j.tenant = t_tenant
                                     AND j.status = 'queued' AND j.run_at <= now()
                                     AND j.priority < l.priority);
            END IF;
            IF NOT more THEN
                s_empty := s_empty || t_tenant;
            END IF;
        END LOOP;
        IF walking THEN
            CLOSE walk;
        END IF;
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

    -- 6 and 7. The tenants' counts and virtual times, the sleepers woken, and every tenant served
    -- or walked past that has no due job left taken out of the runnable set (claim_settle,
    -- below).
    -- The walk knows every tenant it went past (they are in s_empty), so claim_settle is given
    -- neither a stop nor a short claim's reach to read them back from the runnable index.
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
