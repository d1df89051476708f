-- The fair engine's functions, version 3 (migration 0008): time spent throttled. {schema} is
-- the quoted schema name. engine_v2.sql stays as migration 0007 applied it; this file adds
-- token_at, throttled_open and throttled_total and replaces claim_settle and claim_head (same
-- signatures).
-- Never edit it once released; a change is a new file and a new migration.
--
-- tenant_schedule.throttled_seconds counts the seconds a rate-limited tenant had a due job
-- and no whole token; throttled_since opens the current such interval (docs/algorithm.md,
-- "Time spent throttled"). An interval opens when a claim retires the tenant dry while it has
-- a queued job, at now or at that job's run_at if later; it is credited, up to the moment the
-- bucket held its next token (token_at) and never past now, when a claim serves the tenant,
-- retires it for another reason, or `tenants set/apply` settles its bucket (tenants.sql,
-- ops.sql). token_at is read from the bucket (tokens as of refilled_at), so a tenant woken
-- early (an enqueue, a retry, a reap) or late (no claim at its wake_at) is credited exactly
-- the time it had no token.

-- When the tenant's bucket holds (or held) its next whole token: NULL without a rate limit or
-- with a full bucket.
CREATE FUNCTION {schema}.token_at(s {schema}.tenant_schedule) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN s.rate IS NOT NULL AND s.tokens IS NOT NULL AND s.refilled_at IS NOT NULL
        THEN s.refilled_at + make_interval(secs => greatest(0.0, 1 - s.tokens) / s.rate) END
$$;

-- The seconds of the open throttled interval so far: from throttled_since to the next token
-- (token_at), or to now while it has none; 0 when no interval is open.
CREATE FUNCTION {schema}.throttled_open(s {schema}.tenant_schedule) RETURNS float8
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN s.throttled_since IS NULL OR {schema}.token_at(s) IS NULL THEN 0.0
        ELSE greatest(0.0, extract(epoch FROM least(now(), {schema}.token_at(s))
                                               - s.throttled_since)::float8) END
$$;

-- The tenant's time spent throttled up to now (the exporter's counter, `fairq stats`): the
-- credited seconds and the open interval.
CREATE FUNCTION {schema}.throttled_total(s {schema}.tenant_schedule) RETURNS float8
LANGUAGE sql STABLE AS $$
    SELECT s.throttled_seconds + {schema}.throttled_open(s)
$$;

-- As in engine_v2.sql; changed (marked "v3:"): the served tenants' open throttled intervals are
-- credited, and the retirement opens an interval for a tenant retired dry with a queued job
-- (keeping one already open) and credits it for any other; the tenants taken as walked past
-- the stop are the first 1,000 (the walk's own bound).
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
            -- v3: served, so it has had a token since token_at: the interval ends there.
            throttled_seconds = ts.throttled_seconds + {schema}.throttled_open(ts),
            throttled_since = NULL,
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
        -- v3: the first 1,000 of them at most, as the walk visits at most 1,000 tenants. The
        -- stop is read from the rows the walk locked, and a row another claim updated since
        -- this claim's snapshot is locked as it is now (READ COMMITTED follows the update), so
        -- with concurrent claimers the stop can lie past where the walk really was: without a
        -- bound, 10,000 tenants were locked and probed in one claim (4 claims in 100 with 4
        -- claimers over 10,000 tenants, 55-80 ms each).
        suspects := suspects || array(
            SELECT w.tenant FROM (
                (SELECT ts.tenant FROM {schema}.tenant_schedule ts
                 WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
                   AND ts.vtime < stop_v
                 ORDER BY ts.vtime, ts.tenant LIMIT 1000)
                UNION ALL
                (SELECT ts.tenant FROM {schema}.tenant_schedule ts
                 WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
                   AND ts.vtime = stop_v AND ts.tenant < stop_t
                 ORDER BY ts.tenant LIMIT 1000)) w
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
        -- v3: retired dry with a queued job: throttled from now, or from that job's run_at if
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

-- As in engine_v2.sql, except (v3:) that a tenant is returned only if, once its row is locked,
-- it still has a due job, read in a snapshot taken after the lock; if not, its lock is given back
-- and the next runnable tenant with a due job is tried, until none is left. v2 returned the first
-- tenant it could lock: when the claim that held it had just taken its last due job, the wait
-- returned a tenant with nothing to take and the claim came back empty while other tenants had
-- work (eight claimers over eleven tenants, about one run in ten under load). `n` is no longer
-- read (the claim statement passes it).
CREATE OR REPLACE FUNCTION {schema}.claim_head(q text, n int)
RETURNS TABLE (row_ tid, tenant text, vtime float8, weight float8, room int)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    t text;
    r record;
    tried text[] := '{}';
BEGIN
    LOOP
        SELECT ts.tenant INTO t FROM {schema}.tenant_schedule ts
        WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
          AND {schema}.claim_room(ts) > 0 AND ts.tenant <> ALL (tried)
          AND (SELECT true FROM {schema}.jobs j
               WHERE j.queue = q AND j.tenant = ts.tenant AND j.status = 'queued'
                 AND j.run_at <= now() LIMIT 1)
        ORDER BY ts.vtime, ts.tenant
        LIMIT 1;
        EXIT WHEN NOT FOUND;
        tried := tried || t;
        BEGIN
            -- Locked by the key alone, then checked on the row as it is now (as in v2).
            SELECT ts.ctid, ts.tenant, ts.vtime, {schema}.eff_weight(ts) AS weight, ts.active,
                   {schema}.claim_room(ts) AS room
            INTO r FROM {schema}.tenant_schedule ts WHERE ts.queue = q AND ts.tenant = t
            FOR NO KEY UPDATE OF ts;
            IF FOUND AND r.active AND r.room > 0 AND EXISTS (
                    SELECT 1 FROM {schema}.jobs j
                    WHERE j.queue = q AND j.tenant = t AND j.status = 'queued'
                      AND j.run_at <= now()) THEN
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
