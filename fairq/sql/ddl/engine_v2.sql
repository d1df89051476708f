-- The fair engine's functions, version 2 (migration 0007): rate limits and tenant groups.
-- {schema} is the quoted
-- schema name. engine_v1.sql stays as migration 0003 applied it; this file replaces claim_head
-- and claim_settle (same signatures) and adds the token bucket's functions. Never edit it once
-- released; a change is a new file and a new migration.
--
-- A rate-limited tenant (tenant_schedule.rate, jobs per second, and burst, the bucket's size)
-- holds `tokens` as of `refilled_at`; the bucket refills at `rate` up to `burst` (docs/
-- algorithm.md, "Rate limits"). NULL tokens or refilled_at mean a full bucket. A tenant whose
-- bucket holds no whole token leaves the runnable set until its next token is due (wake_at),
-- and the claim's sleeper wake-up brings it back: no claim walks it, nothing polls for it.

-- A tenant's tokens now, on the database clock; NULL when it has no rate limit.
CREATE FUNCTION {schema}.tenant_tokens(s {schema}.tenant_schedule) RETURNS float8
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN s.rate IS NOT NULL THEN least(s.burst::float8, coalesce(
        s.tokens + s.rate * extract(epoch FROM now() - s.refilled_at)::float8, s.burst)) END
$$;

-- How many jobs a claim may take from a tenant: its free slots, and with a rate limit at most
-- its whole tokens (the 1e-9 absorbs the rounding of a wake-up timed to the token).
CREATE FUNCTION {schema}.claim_room(s {schema}.tenant_schedule) RETURNS int
LANGUAGE sql STABLE AS $$
    SELECT least(s.max_running - s.running, floor({schema}.tenant_tokens(s) + 1e-9)::int)
$$;

-- A rate-limited tenant without a whole token: it must leave the runnable set.
CREATE FUNCTION {schema}.tenant_dry(s {schema}.tenant_schedule) RETURNS bool
LANGUAGE sql STABLE AS $$
    SELECT coalesce({schema}.tenant_tokens(s) + 1e-9 < 1, false)
$$;

-- When a dry tenant's next token is due (now when it is not dry).
CREATE FUNCTION {schema}.token_due(s {schema}.tenant_schedule) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN {schema}.tenant_dry(s)
        THEN now() + make_interval(secs => (1 - {schema}.tenant_tokens(s)) / s.rate)
        ELSE now() END
$$;

-- Tenant groups (docs/algorithm.md, "Tenant groups"): a tenant's weight in a claim is its own
-- weight times its group's factor in the queue, group weight / the summed weights of the group's
-- active tenants (tenants without a group are in the group 'default', weight 1 unless set).
-- So a group's active tenants together weigh what the group does, whatever their number. No
-- factor (no group configured, or a group not refreshed yet): the tenant's own weight.
-- plpgsql, not sql: a sql function with a subquery is never inlined, and ran as a statement of
-- its own, planned on each call; plpgsql's statements keep their (generic) plans.
CREATE FUNCTION {schema}.eff_weight(s {schema}.tenant_schedule) RETURNS float8
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q text := s.queue;
    grp text := coalesce(s.tenant_group, 'default');
    f float8;
BEGIN
    SELECT g.factor INTO f FROM {schema}.group_schedule g
    WHERE g.queue = q AND g.tenant_group = grp;
    RETURN s.weight * coalesce(f, 1.0);
END
$$;

-- A tenant's terms in a fair claim: its weight (its group's, eff_weight) and its room
-- (claim_room). One call, so claim_fair stays within psycopg's statement cache limit.
CREATE FUNCTION {schema}.claim_terms(s {schema}.tenant_schedule, OUT weight float8, OUT room int)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    weight := {schema}.eff_weight(s);
    room := {schema}.claim_room(s);
END
$$;

-- The factors of a queue's groups, recomputed from its active tenants (both partial indexes:
-- runnable and capped). Called by claim_settle at most once a second per queue, by one claim at
-- a time, and only while some group is configured.
CREATE FUNCTION {schema}.refresh_groups(q text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    DELETE FROM {schema}.group_schedule g WHERE g.queue = q;
    INSERT INTO {schema}.group_schedule (queue, tenant_group, factor, refreshed_at)
    SELECT q, a.grp, coalesce((SELECT tg.weight FROM {schema}.tenant_groups tg
                               WHERE tg.tenant_group = a.grp), 1.0) / sum(a.weight), now()
    FROM (SELECT coalesce(ts.tenant_group, 'default') AS grp, ts.weight
          FROM {schema}.tenant_schedule ts
          WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
          UNION ALL
          SELECT coalesce(ts.tenant_group, 'default'), ts.weight
          FROM {schema}.tenant_schedule ts
          WHERE ts.queue = q AND ts.active AND ts.running >= ts.max_running) a
    GROUP BY a.grp;
    IF NOT FOUND THEN  -- no active tenant: a marker row, so the next refresh waits a second
        INSERT INTO {schema}.group_schedule (queue, tenant_group, factor, refreshed_at)
        VALUES (q, '', 1.0, now());
    END IF;
END
$$;

-- Whether this claim should refresh its queue's group factors: some group is configured, the
-- last refresh is a second old, and no other claim is refreshing them. One statement: without
-- any group, its first test is all a claim pays.
CREATE FUNCTION {schema}.groups_due(q text) RETURNS bool
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM {schema}.tenant_groups)
        AND coalesce((SELECT max(g.refreshed_at) FROM {schema}.group_schedule g
                      WHERE g.queue = q), '-infinity') <= now() - interval '1 second'
        AND pg_try_advisory_xact_lock(hashtext('fairq.refresh_groups'), hashtext(q));
END
$$;

-- As in engine_v1.sql, with the group's weight (eff_weight).
CREATE OR REPLACE FUNCTION {schema}.claim_share(q text, hi float8, batch int, by_weight bool,
                                                first float8[])
RETURNS float8
LANGUAGE plpgsql STABLE AS $$
DECLARE
    total float8 := 0;
    k int := 0;
    w float8;
BEGIN
    FOREACH w IN ARRAY first LOOP
        EXIT WHEN k >= batch;
        total := total + CASE WHEN by_weight THEN w ELSE 1.0 END;
        k := k + 1;
    END LOOP;
    IF k < batch AND hi IS NOT NULL THEN
        FOR w IN
            SELECT {schema}.eff_weight(ts) FROM {schema}.tenant_schedule ts
            WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running AND ts.vtime <= hi
            ORDER BY ts.vtime, ts.tenant
            LIMIT batch - k
        LOOP
            total := total + CASE WHEN by_weight THEN w ELSE 1.0 END;
        END LOOP;
    END IF;
    RETURN CASE WHEN total > 0 THEN total ELSE 1.0 END;
END
$$;

-- As in engine_v1.sql, except that a tenant without a token is not waited for, `room` is
-- bounded by its tokens, and the weight is the group's (eff_weight).
CREATE OR REPLACE FUNCTION {schema}.claim_head(q text, n int)
RETURNS TABLE (row_ tid, tenant text, vtime float8, weight float8, room int)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    t text;
    r record;
BEGIN
    FOR t IN
        SELECT ts.tenant FROM {schema}.tenant_schedule ts
        WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
          AND {schema}.claim_room(ts) > 0
          AND (SELECT true FROM {schema}.jobs j
               WHERE j.queue = q AND j.tenant = ts.tenant AND j.status = 'queued'
                 AND j.run_at <= now() LIMIT 1)
        ORDER BY ts.vtime, ts.tenant
        LIMIT n
    LOOP
        BEGIN
            -- Locked by the key alone (a condition on active or running, even outside the
            -- locking query, was planned into it, reading the runnable index), then checked on
            -- the row the lock returns: after a wait, the row as it is now.
            SELECT ts.ctid, ts.tenant, ts.vtime, {schema}.eff_weight(ts) AS weight, ts.active,
                   {schema}.claim_room(ts) AS room
            INTO r FROM {schema}.tenant_schedule ts WHERE ts.queue = q AND ts.tenant = t
            FOR NO KEY UPDATE OF ts;
            IF FOUND AND r.active AND r.room > 0 THEN
                row_ := r.ctid;
                tenant := r.tenant;
                vtime := r.vtime;
                weight := r.weight;
                room := r.room;
                RETURN NEXT;
                RETURN;
            END IF;
            RAISE EXCEPTION USING ERRCODE = 'FQ001';
        EXCEPTION WHEN SQLSTATE 'FQ001' THEN
            NULL;  -- the lock on that row is given back with the subtransaction
        END;
    END LOOP;
END
$$;

-- As in engine_v1.sql (see there for the snapshots and locks), plus the group factors
-- refresh (groups_due) and the token bucket: each
-- served rate-limited tenant pays one token per job (refilled up to now first), and a tenant
-- left without a whole token is retired like one left without a due job, with wake_at = when
-- its next token is due (or its first queued job's run_at, if later).
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
BEGIN
    IF {schema}.groups_due(q) THEN
        PERFORM {schema}.refresh_groups(q);
    END IF;
    IF cardinality(w_rows) > 0 THEN
        v := {schema}.queue_vtime(q);  -- before any sleeper is active
    END IF;
    -- Served tenants (a sleeper among them wakes at V here); then the sleepers not served,
    -- whose rows are unchanged. Only by ctid: a condition on `active` would let the planner
    -- read the idle tenants' index for it.
    WITH u AS (
        UPDATE {schema}.tenant_schedule ts
        SET running = ts.running + x.n, claimed_total = ts.claimed_total + x.n,
            vtime = CASE WHEN x.row_ = ANY (w_rows) THEN v ELSE ts.vtime END + x.inc,
            active = ts.active OR x.row_ = ANY (w_rows),
            wake_at = CASE WHEN x.row_ = ANY (w_rows) THEN NULL ELSE ts.wake_at END,
            tokens = {schema}.tenant_tokens(ts) - x.n,
            refilled_at = CASE WHEN ts.rate IS NOT NULL THEN now() END,
            last_served_at = now()
        FROM unnest(s_rows, s_n, s_inc) AS x(row_, n, inc)
        WHERE ts.ctid = x.row_
        RETURNING ts.tenant, ts.rate IS NOT NULL AND ts.tokens + 1e-9 < 1 AS dry
    )
    SELECT coalesce(array_agg(u.tenant) FILTER (WHERE u.dry), '{}') INTO dry FROM u;
    UPDATE {schema}.tenant_schedule ts
    SET active = true, wake_at = NULL, vtime = v
    WHERE ts.ctid = ANY (array(SELECT r FROM unnest(w_rows) r WHERE r <> ALL (s_rows)));

    -- Suspects: served and looking empty or left dry, sleepers it did not serve, and the
    -- runnable tenants its walk went past (held by other claims, with nothing due, or dry).
    suspects := s_empty || dry || array(SELECT x FROM unnest(w_tenants) x WHERE x <> ALL (s_tenants));
    IF stop_v IS NOT NULL THEN
        suspects := suspects || array(
            SELECT ts.tenant FROM {schema}.tenant_schedule ts
            WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
              AND ts.vtime < stop_v AND ts.tenant <> ALL (s_tenants)
            UNION ALL
            SELECT ts.tenant FROM {schema}.tenant_schedule ts
            WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
              AND ts.vtime = stop_v AND ts.tenant < stop_t AND ts.tenant <> ALL (s_tenants));
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
                   ORDER BY j.run_at LIMIT 1)
    WHERE ts.ctid = ANY (locked)
      AND ({schema}.tenant_dry(ts)
           OR (SELECT true FROM {schema}.jobs j
               WHERE j.queue = ts.queue AND j.tenant = ts.tenant AND j.status = 'queued'
                 AND j.run_at <= now() LIMIT 1) IS NULL);
    GET DIAGNOSTICS retired = ROW_COUNT;
    RETURN retired;
END
$$;
