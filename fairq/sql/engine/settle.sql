-- The end of a claim: the served tenants' counts and virtual times, the sleepers woken, and the
-- tenants left without a due job (or a token) taken out of the runnable set. {schema} is the
-- quoted schema name.

-- Called by both claims (claim_fair, and claim_fifo in fairq/sql/claim.sql) once their jobs
-- are marked running. Each statement of a VOLATILE function gets a fresh snapshot under READ
-- COMMITTED, which the claim's own statement cannot have:
-- - The tenant rows the claim holds are written by ctid. A row it locked after another claim
--   changed it is newer than the claim's snapshot; an update in the claim's own statement
--   would silently miss that change.
-- - Leaving the runnable set must not race an enqueue. A producer holds FOR KEY SHARE on its
--   tenants' rows until it commits (enqueue_many); retiring takes FOR UPDATE, which conflicts,
--   SKIP LOCKED (a tenant whose producer has not committed stays runnable). Only once that lock
--   is held is "no due job" decided, with a snapshot taken after it: a job committed before the
--   lock is seen; a producer that locks after it waits, finds the tenant retired and wakes it.
-- A rate-limited tenant pays one token per job (refilled up to now first), and one left
-- without a whole token is retired like one left without a due job, waking when its next token
-- is due (or its first queued job's run_at, if later); the retirement opens or credits its
-- throttled interval (rate_limits.sql).
--
-- Arguments: the queue; where a walk ended, for a claim that does not list the tenants it
-- went past: `walked_all` when it walked every candidate up to `reach` (its window's end in
-- virtual time), (`stop_vtime`, `stop_tenant`) the last tenant it served when it filled its
-- batch (both claims pass NULLs: claim_fair lists those tenants in `emptied`, fifo walks
-- none); the tenants it served (their rows, names, jobs taken, virtual time added), those that
-- looked empty in the claim's snapshot, and the sleepers it locked, woken here (at V with their debt, vtime.sql). Returns
-- how many tenants it retired.
CREATE OR REPLACE FUNCTION {schema}.claim_settle(
    q text, walked_all bool, reach float8, stop_vtime float8, stop_tenant text,
    served_rows tid[], served_tenants text[], served_jobs int[], served_vtime float8[],
    emptied text[], sleeper_rows tid[], sleeper_tenants text[]
) RETURNS int
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v float8;
    dry text[];
    suspects text[];
    locked tid[];
    retired int;
    gone tid[] := '{}';
    done text[];
    capped text[];
BEGIN
    IF {schema}.groups_due(q) THEN
        PERFORM {schema}.refresh_groups(q);
    END IF;
    IF cardinality(sleeper_rows) > 0 THEN
        v := {schema}.queue_vtime(q);  -- before any sleeper is active
    END IF;
    -- A served tenant without a rate limit that looked empty is retired by the same row write
    -- that counts its jobs. Its row is locked FOR UPDATE first, SKIP LOCKED: that lock
    -- conflicts with an enqueue's FOR KEY SHARE, so a tenant an open enqueue is adding a job to
    -- is skipped (it stays runnable), and an enqueue that comes later waits for this claim and
    -- then sees the tenant idle and wakes it. The UPDATE's snapshot is taken after the lock, so
    -- it sees every job an enqueue committed before it.
    IF cardinality(emptied) > 0 THEN
        -- By ctid alone (a Tid Scan): the rows this claim holds cannot move. The served rows
        -- whose tenant looked empty are picked out of served_rows inside the statement that
        -- locks them. Not by `ts.tenant = ANY (emptied)`: the planner reads that through
        -- tenant_schedule_pkey, every tenant of every queue, instead of the rows' ctids.
        gone := array(SELECT ts.ctid FROM {schema}.tenant_schedule ts
                      WHERE ts.ctid = ANY (array(SELECT x.r FROM unnest(served_rows, served_tenants) AS x(r, t)
                                                 WHERE x.t = ANY (emptied)))
                        AND ts.rate IS NULL
                      FOR UPDATE OF ts SKIP LOCKED);
    END IF;
    -- Served tenants (a sleeper among them wakes here: V, with its debt); then the sleepers not served,
    -- whose rows are unchanged. Only by ctid: a condition on `active` would let the planner
    -- read the idle tenants' index for it.
    -- The served tenants' slots given back while a claim held their rows (slots.sql) are
    -- folded in by the same write.
    WITH f AS (
        DELETE FROM {schema}.slot_returns r
        WHERE r.queue = q AND r.tenant = ANY (served_tenants)
        RETURNING r.tenant, r.n, r.corr, r.runs, r.run_sum
    ), fs AS (
        SELECT f.tenant, sum(f.n)::int AS n, sum(f.corr) AS corr, sum(f.runs)::int AS runs,
               sum(f.run_sum) AS run_sum
        FROM f GROUP BY f.tenant
    ), u AS (
        UPDATE {schema}.tenant_schedule ts
        SET running = ts.running + x.n - coalesce(fs.n, 0),
            claimed_total = ts.claimed_total + x.n,
            vtime = CASE WHEN x.row_ = ANY (sleeper_rows)
                         THEN greatest(v, least(ts.vtime, v + greatest(1.0, 1.0 / ts.weight)))
                         ELSE ts.vtime END + x.inc
                    + CASE WHEN ts.active AND fs.corr <> 0.0
                           THEN fs.corr / {schema}.eff_weight(ts) ELSE 0.0 END,
            avg_run_s = {schema}.run_average(ts.avg_run_s, fs.runs, fs.run_sum),
            active = NOT x.retire AND (ts.active OR x.row_ = ANY (sleeper_rows)),
            -- retired, it waits for its earliest delayed job, if any.
            wake_at = CASE WHEN x.retire THEN x.first_at
                           WHEN x.row_ = ANY (sleeper_rows) THEN NULL ELSE ts.wake_at END,
            tokens = {schema}.tenant_tokens(ts) - x.n,
            refilled_at = CASE WHEN ts.rate IS NOT NULL THEN now() END,
            -- served, so it has had a token since token_at: the interval ends there.
            throttled_seconds = ts.throttled_seconds + {schema}.throttled_open(ts),
            throttled_since = NULL,
            last_served_at = now()
        -- One read of the tenant's queued jobs, their earliest run_at, decides both whether it
        -- retires and when it wakes. OFFSET 0 keeps the planner from copying the subquery into
        -- both of its uses.
        FROM (SELECT z.*, z.row_ = ANY (gone) AND (z.first_at IS NULL OR z.first_at > now())
                          AS retire
              FROM (SELECT y.row_, y.t, y.n, y.inc,
                           CASE WHEN y.row_ = ANY (gone) THEN
                               (SELECT min(j.run_at) FROM {schema}.jobs j
                                WHERE j.queue = q AND j.tenant = y.t AND j.status = 'queued')
                           END AS first_at
                    FROM unnest(served_rows, served_tenants, served_jobs, served_vtime)
                        AS y(row_, t, n, inc)
                    OFFSET 0) z) x
            LEFT JOIN fs ON fs.tenant = x.t
        WHERE ts.ctid = x.row_
        RETURNING ts.tenant, ts.rate IS NOT NULL AND ts.tokens + 1e-9 < 1 AS dry,
                  NOT ts.active AS out, ts.running >= ts.max_running AS capped
    )
    SELECT coalesce(array_agg(u.tenant) FILTER (WHERE u.dry), '{}'),
           coalesce(array_agg(u.tenant) FILTER (WHERE u.out), '{}'),
           coalesce(array_agg(u.tenant) FILTER (WHERE u.capped), '{}')
    INTO dry, done, capped FROM u;
    IF cardinality(sleeper_rows) > 0 THEN
        UPDATE {schema}.tenant_schedule ts
        SET active = true, wake_at = NULL,
            vtime = greatest(v, least(ts.vtime, v + greatest(1.0, 1.0 / ts.weight)))
        WHERE ts.ctid = ANY (array(SELECT r FROM unnest(sleeper_rows) r WHERE r <> ALL (served_rows)));
    END IF;
    -- After every write by ctid (these write rows by key, and move them): tenants left at
    -- their cap see the slots of finishes not yet committed (slots.sql); capped tenants given
    -- slots back are runnable again for the next claim.
    IF cardinality(capped) > 0 THEN
        PERFORM {schema}.settle_capped(array_fill(q, ARRAY[cardinality(capped)]), capped);
    END IF;
    IF EXISTS (SELECT 1 FROM {schema}.slot_returns r WHERE r.queue = q AND r.capped) THEN
        PERFORM {schema}.fold_capped(q);
    END IF;

    -- Suspects: served and looking empty (unless retired above) or left dry, sleepers it did
    -- not serve, and the runnable tenants its walk went past (held by other claims, with
    -- nothing due, or dry). When there can be none (the common claim: every tenant that
    -- looked empty retired above, none dry, every sleeper served, no range to read), the claim
    -- ends here, decided by plain expressions rather than by a statement building an empty
    -- array.
    IF emptied <@ done AND cardinality(dry) = 0 AND sleeper_tenants <@ served_tenants
       AND stop_vtime IS NULL AND NOT (walked_all AND reach IS NOT NULL) THEN
        RETURN 0;
    END IF;
    suspects := array(SELECT x FROM unnest(emptied) x WHERE x <> ALL (done)) || dry
                || array(SELECT x FROM unnest(sleeper_tenants) x WHERE x <> ALL (served_tenants));
    IF stop_vtime IS NOT NULL THEN
        -- The runnable tenants before the stop in (vtime, tenant) order, read in one range
        -- backwards from it, 1,000 at most: a walk visits at most 1,000 tenants, so when the
        -- stop is where the walk was these are every tenant it went past. The stop is read from
        -- the rows the walk locked, and a row another claim updated since this claim's snapshot
        -- is locked as it is now (READ COMMITTED follows the update), so with concurrent
        -- claimers it can lie past where the walk was: the bound caps that case at 1,000
        -- probes. A suspect is retired only after a probe under its lock: which tenants are
        -- suspected changes what a claim reads, never what is right. Backwards from the stop's
        -- key, the read ends after 1,000 rows whatever the statistics say.
        suspects := suspects || array(
            SELECT w.tenant FROM (
                SELECT ts.tenant FROM {schema}.tenant_schedule ts
                WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
                  AND (ts.vtime, ts.tenant) < (stop_vtime, stop_tenant)
                ORDER BY ts.vtime DESC, ts.tenant DESC LIMIT 1000) w
            WHERE w.tenant <> ALL (served_tenants));
    ELSIF walked_all AND reach IS NOT NULL THEN
        suspects := suspects || array(
            SELECT w.tenant FROM (
                SELECT ts.tenant FROM {schema}.tenant_schedule ts
                WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
                  AND ts.vtime <= reach
                ORDER BY ts.vtime, ts.tenant LIMIT 1000) w
            WHERE w.tenant <> ALL (served_tenants));
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
