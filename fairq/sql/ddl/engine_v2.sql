-- The fair engine's functions, version 2 (migration 0007): rate limits. {schema} is the quoted
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

-- As in engine_v1.sql, except that a tenant without a token is not waited for, and `room` is
-- bounded by its tokens.
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
            SELECT ts.ctid, ts.tenant, ts.vtime, ts.weight, ts.active,
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

-- As in engine_v1.sql (see there for the snapshots and locks), plus the token bucket: each
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
