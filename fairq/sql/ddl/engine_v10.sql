-- The fair engine's functions, version 10 (migration 0017): claim_settle finds the tenants a
-- walk went past in one range read backwards from the walk's stop. {schema} is the quoted
-- schema name. This file replaces claim_settle (engine_v5.sql), same signature and result:
-- workers of the earlier release call it unchanged. Only the suspects' read before the stop
-- changes (see it below). Never edit it once released; a change is a new file and a new
-- migration.
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
        -- By ctid alone (a Tid Scan): the rows this claim holds cannot move.
        gone := array(SELECT x.r FROM unnest(s_rows, s_tenants) AS x(r, t)
                      WHERE x.t = ANY (s_empty));
        gone := array(SELECT ts.ctid FROM {schema}.tenant_schedule ts
                      WHERE ts.ctid = ANY (gone) AND ts.rate IS NULL
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
    UPDATE {schema}.tenant_schedule ts
    SET active = true, wake_at = NULL, vtime = v
    WHERE ts.ctid = ANY (array(SELECT r FROM unnest(w_rows) r WHERE r <> ALL (s_rows)));

    -- Suspects: served and looking empty (unless retired above) or left dry, sleepers it did
    -- not serve, and the runnable tenants its walk went past (held by other claims, with
    -- nothing due, or dry).
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
