-- Slots given back: the end of every finish, failure, release and reap (fairq/sql/jobs.sql),
-- and policy time's correction of its charges. {schema} is the quoted schema name.
--
-- A tenant's running count is tenant_schedule.running minus its rows in slot_returns. A busy
-- tenant's row is held by a claim most of the time, so a finish does not wait for it: it
-- writes the row when it can lock it at once and otherwise leaves the slot in slot_returns,
-- which whoever holds the row next folds in (the claims that serve the tenant, the claim that
-- finds it capped, the maintenance). A row written for a job that was requeued or retried
-- (the tenant wakes, its virtual time may move) is waited for, as before.
--
-- Caps stay exact: a slot not yet folded only counts as still running, so a claim may grant
-- less, never more. What must not happen is a tenant left at its cap by a slot that came back
-- unseen: a claim that takes a tenant to its cap would not see a finish that has not
-- committed, and the tenant would then leave the runnable index with a slot free and nobody
-- to fold it. The two meet on an advisory lock per (queue, tenant) (`returns_lock`): a
-- finish takes it shared if it is free, after its row locks, and holds it from before it reads
-- whether the tenant is capped until it commits; a claim that caps a tenant takes it
-- exclusively (waiting for those finishes) and then folds again in a fresh snapshot. A finish
-- that finds the tenant capped, or finds the lock taken or asked for by such a claim, marks
-- its slot `capped`, and the queue's next claim folds it before its walk (fold_capped). A
-- finish never waits for the lock, and holding it waits for nothing, so a claim's wait for it
-- always ends.

-- The advisory lock key of a (queue, tenant)'s slot returns: class 1718710899 ('fqrs'), the
-- hash of the pair. Two pairs with one hash share a lock: an extra wait, never a wrong count.
-- Inlined into its callers (no SET clause; nothing looked up through the caller's path).
CREATE OR REPLACE FUNCTION {schema}.returns_lock(q text, t text) RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT pg_catalog.hashtext(q OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) t) $$;

-- Fold the tenants' slot returns into their rows, which the caller holds: running down by the
-- slots, policy time's corrections into an active tenant's virtual time, the run times into its
-- expected run time (as return_slots does). In a statement of its own, so it sees every
-- return committed before it started. Returns how many rows it wrote.
CREATE OR REPLACE FUNCTION {schema}.fold_returns(queues text[], tenants text[]) RETURNS int
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    written int;
BEGIN
    -- The rows by ctid (a Tid Scan), each found by its key: a join of the set to the table
    -- could read the whole table.
    WITH f AS (
        DELETE FROM {schema}.slot_returns r
        USING unnest(queues, tenants) AS x(q, t)
        WHERE r.queue = x.q AND r.tenant = x.t
        RETURNING r.queue, r.tenant, r.n, r.corr, r.runs, r.run_sum
    ), s AS (
        SELECT y.ctid AS row_, sum(f.n)::int AS n, sum(f.corr) AS corr,
               sum(f.runs)::int AS runs, sum(f.run_sum) AS run_sum
        FROM f CROSS JOIN LATERAL (
            SELECT ts.ctid FROM {schema}.tenant_schedule ts
            WHERE ts.queue = f.queue AND ts.tenant = f.tenant) y
        GROUP BY y.ctid
    )
    UPDATE {schema}.tenant_schedule ts
    SET running = ts.running - s.n,
        vtime = CASE WHEN ts.active AND s.corr <> 0.0
                     THEN ts.vtime + s.corr / {schema}.eff_weight(ts) ELSE ts.vtime END,
        avg_run_s = {schema}.run_average(ts.avg_run_s, s.runs, s.run_sum)
    FROM s
    WHERE ts.ctid = s.row_;
    GET DIAGNOSTICS written = ROW_COUNT;
    RETURN written;
END
$$;

-- The expected run time after `runs` jobs that ran `run_sum` seconds in all: an exponential
-- moving average in which each job weighs 0.2 (the first one sets it). Inlined, as above.
CREATE OR REPLACE FUNCTION {schema}.run_average(avg_s float8, runs int, run_sum float8) RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE
-- OPERATOR() has one precedence, left to right: every step is in parentheses.
AS $$ SELECT CASE WHEN runs OPERATOR(pg_catalog.>) 0 AND run_sum IS NOT NULL
                  THEN (run_sum OPERATOR(pg_catalog./) runs::pg_catalog.float8)
                       OPERATOR(pg_catalog.+)
                       ((coalesce(avg_s, run_sum OPERATOR(pg_catalog./) runs::pg_catalog.float8)
                         OPERATOR(pg_catalog.-)
                         (run_sum OPERATOR(pg_catalog./) runs::pg_catalog.float8))
                        OPERATOR(pg_catalog.*)
                        pg_catalog.power(0.8::pg_catalog.float8, runs::pg_catalog.float8))
                  ELSE avg_s END $$;

-- The queue's capped tenants with slots given back (slot_returns.capped): folded in, so those
-- with a free slot are runnable again. Rows another transaction holds are skipped (it folds
-- them, or the next claim does). Every claim calls it when there is one.
CREATE OR REPLACE FUNCTION {schema}.fold_capped(q text) RETURNS int
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ts_ text[];
BEGIN
    ts_ := array(SELECT x.tenant
                 FROM (SELECT DISTINCT r.tenant FROM {schema}.slot_returns r
                       WHERE r.queue = q AND r.capped ORDER BY r.tenant LIMIT 1000) t
                 CROSS JOIN LATERAL (
                     SELECT ts.tenant FROM {schema}.tenant_schedule ts
                     WHERE ts.queue = q AND ts.tenant = t.tenant
                     FOR NO KEY UPDATE OF ts SKIP LOCKED) x);
    IF cardinality(ts_) = 0 THEN
        RETURN 0;
    END IF;
    RETURN {schema}.fold_returns(array_fill(q, ARRAY[cardinality(ts_)]), ts_);
END
$$;

-- The maintenance's sweep: slots given back more than `age` seconds ago, whose tenant no claim
-- has served since (an idle tenant's last jobs), folded into the rows it can lock at once;
-- returns of tenants whose rows are gone are deleted.
-- Slots counted ahead for a worker (claim.sql, give_ahead) and not started within `age` seconds
-- of the last use are given back with it.
CREATE OR REPLACE FUNCTION {schema}.fold_stale_returns(age float8) RETURNS int
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    sq text[];
    st text[];
    qs text[];
    ts_ text[];
    given int;
BEGIN
    given := {schema}.return_budgets(age);
    SELECT coalesce(array_agg(t.queue), '{}'), coalesce(array_agg(t.tenant), '{}') INTO sq, st
    FROM (SELECT DISTINCT r.queue, r.tenant FROM {schema}.slot_returns r
          WHERE r.at < now() - make_interval(secs => age)
          ORDER BY r.queue, r.tenant LIMIT 10000) t;
    IF cardinality(sq) = 0 THEN
        RETURN given;
    END IF;
    SELECT coalesce(array_agg(y.queue), '{}'), coalesce(array_agg(y.tenant), '{}') INTO qs, ts_
    FROM unnest(sq, st) AS x(q, t)
    CROSS JOIN LATERAL (
        SELECT ts.queue, ts.tenant FROM {schema}.tenant_schedule ts
        WHERE ts.queue = x.q AND ts.tenant = x.t
        FOR NO KEY UPDATE OF ts SKIP LOCKED) y;
    -- Those whose tenant's row is gone (a tenant deleted): nothing to fold them into.
    DELETE FROM {schema}.slot_returns r
    USING unnest(sq, st) AS x(q, t)
    WHERE r.queue = x.q AND r.tenant = x.t
      AND (SELECT ts.tenant FROM {schema}.tenant_schedule ts
           WHERE ts.queue = x.q AND ts.tenant = x.t) IS NULL;
    IF cardinality(ts_) = 0 THEN
        RETURN given;
    END IF;
    RETURN given + {schema}.fold_returns(qs, ts_);
END
$$;

-- Slots counted ahead for workers (claim.sql, give_ahead) unused for `age` seconds (a tenant no
-- longer busy, a worker stopped or dead): given back to the rows the sweep can lock at once,
-- out of running and claimed_total (the claim that counted them counted them claimed too);
-- their virtual time is kept (paid early). The tenant row is locked before the worker's row,
-- as a claim that counts slots does; the delete may wait a moment for its worker's claim
-- starting jobs from it, which waits for nothing. Budgets whose tenant's row is gone are
-- deleted. Returns how many rows it wrote.
CREATE OR REPLACE FUNCTION {schema}.return_budgets(age float8) RETURNS int
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    qs text[];
    ts_ text[];
    written int;
BEGIN
    SELECT coalesce(array_agg(y.queue), '{}'), coalesce(array_agg(y.tenant), '{}') INTO qs, ts_
    FROM (SELECT DISTINCT b.queue, b.tenant FROM {schema}.claim_budgets b
          WHERE b.at < now() - make_interval(secs => age)
          ORDER BY b.queue, b.tenant LIMIT 10000) x
    CROSS JOIN LATERAL (
        SELECT ts.queue, ts.tenant FROM {schema}.tenant_schedule ts
        WHERE ts.queue = x.queue AND ts.tenant = x.tenant
        FOR NO KEY UPDATE OF ts SKIP LOCKED) y;
    DELETE FROM {schema}.claim_budgets b
    WHERE b.at < now() - make_interval(secs => age)
      AND (SELECT ts.tenant FROM {schema}.tenant_schedule ts
           WHERE ts.queue = b.queue AND ts.tenant = b.tenant) IS NULL;
    IF cardinality(qs) = 0 THEN
        RETURN 0;
    END IF;
    WITH d AS (
        DELETE FROM {schema}.claim_budgets b
        USING unnest(qs, ts_) AS x(q, t)
        WHERE b.queue = x.q AND b.tenant = x.t AND b.at < now() - make_interval(secs => age)
        RETURNING b.queue, b.tenant, b.slots
    ), s AS (
        SELECT y.ctid AS row_, sum(d.slots)::int AS slots
        FROM d CROSS JOIN LATERAL (
            SELECT ts.ctid FROM {schema}.tenant_schedule ts
            WHERE ts.queue = d.queue AND ts.tenant = d.tenant) y
        GROUP BY y.ctid
    )
    UPDATE {schema}.tenant_schedule ts
    SET running = ts.running - s.slots, claimed_total = ts.claimed_total - s.slots
    FROM s
    WHERE ts.ctid = s.row_;
    GET DIAGNOSTICS written = ROW_COUNT;
    RETURN written;
END
$$;

-- A claim (or a change of caps) that leaves these tenants at their cap: wait for the finishes
-- of theirs that have not committed (they hold returns_lock shared), then fold what they gave
-- back. The caller holds the tenants' rows. Returns how many rows it wrote.
CREATE OR REPLACE FUNCTION {schema}.settle_capped(queues text[], tenants text[]) RETURNS int
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_catalog.pg_advisory_xact_lock(1718710899, k.k)
    FROM (SELECT DISTINCT {schema}.returns_lock(x.q, x.t) AS k
          FROM unnest(queues, tenants) AS x(q, t) ORDER BY 1 OFFSET 0) k;
    RETURN {schema}.fold_returns(queues, tenants);
END
$$;

-- The tenants' running counts lowered by the jobs that left them. Per tenant: `counts` jobs
-- left it; `due_now`: one of them is queued again and due (a reaped or released job), so the
-- tenant is runnable again (at the queue's virtual time if it was idle); `retry_ats`: the
-- earliest retry of a failed job, which an idle tenant wakes for. Policy time: `corrections`,
-- the seconds its jobs ran minus the seconds the claims charged them (jobs.charged_s), added
-- to an active tenant's virtual time over its effective weight (an idle one's is dropped: it
-- comes back at V with a bounded debt, vtime.sql); `run_counts` of its jobs ran for
-- `run_means` seconds on average, which move its expected run time (run_average). NULL
-- arrays: none. Returns how many tenant rows it wrote.
--
-- 1. Every tenant's row locked in (queue, tenant) order, by one statement: the rows of tenants
--    that wake (a requeued job or a retry) waited for, the others taken only if free (SKIP
--    LOCKED). Even SKIP LOCKED may wait a moment: when the transaction holding the row ends
--    just as it is asked, PostgreSQL locks the newer versions of the row too and waits for
--    whoever holds those (docs/decisions/018-skip-locked-can-wait.md). So every lock here is
--    taken in key order, before anything a claim waits for.
-- 2. The rows locked, written by one UPDATE of its own that reaches them by ctid, through the
--    newest version the lock followed (locked and then updated by one statement, a row that
--    changed after that statement's snapshot is reached twice, and the second time waits
--    behind any claim queued on the older version, which waits for this transaction).
-- 3. The slots of rows another transaction holds, left in slot_returns: returns_lock taken
--    shared if it is free, and the slot marked `capped` when the tenant is at its cap in a
--    snapshot taken after that lock, or when a claim capping the tenant holds the lock or
--    waits for it (the queue's next claim folds it). A finish never waits for that lock.
CREATE OR REPLACE FUNCTION {schema}.return_slots(queues text[], tenants text[], counts int[],
                                      due_now bool[], retry_ats timestamptz[],
                                      corrections float8[] DEFAULT NULL,
                                      run_counts int[] DEFAULT NULL,
                                      run_means float8[] DEFAULT NULL) RETURNS int
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    written int := 0;
    l_q text[];
    l_t text[];
    l_n int[];
    l_req bool[];
    l_retry timestamptz[];
    l_corr float8[];
    l_runs int[];
    l_sum float8[];
    l_wake bool[];
    h_rows tid[];
    busy int[];
BEGIN
    -- 1. Rows in (queue, tenant) order: the sorted list is the outer side of a nested loop,
    -- and each lateral lock is taken as its row comes. h_rows: the rows locked, NULL where
    -- another transaction holds the row (or a waking tenant's row is gone).
    SELECT array_agg(x.queue), array_agg(x.tenant), array_agg(x.n), array_agg(x.requeued),
           array_agg(x.retry_at), array_agg(x.corr), array_agg(x.runs), array_agg(x.run_sum),
           array_agg(x.wakes), array_agg(coalesce(w.ctid, f.ctid))
    INTO l_q, l_t, l_n, l_req, l_retry, l_corr, l_runs, l_sum, l_wake, h_rows
    FROM (SELECT x.queue, x.tenant, x.n, coalesce(x.requeued, false) AS requeued, x.retry_at,
                 coalesce(x.corr, 0.0) AS corr, coalesce(x.runs, 0) AS runs,
                 coalesce(x.mean * x.runs, 0.0) AS run_sum,
                 coalesce(x.requeued, false) OR x.retry_at IS NOT NULL AS wakes
          FROM unnest(queues, tenants, counts, due_now, retry_ats, corrections, run_counts,
                      run_means)
              AS x(queue, tenant, n, requeued, retry_at, corr, runs, mean)
          WHERE x.tenant IS NOT NULL
          ORDER BY x.queue, x.tenant OFFSET 0) x
    LEFT JOIN LATERAL (
        SELECT ts.ctid FROM {schema}.tenant_schedule ts
        WHERE ts.queue = x.queue AND ts.tenant = x.tenant AND x.wakes
        FOR NO KEY UPDATE OF ts) w ON true
    LEFT JOIN LATERAL (
        SELECT ts.ctid FROM {schema}.tenant_schedule ts
        WHERE ts.queue = x.queue AND ts.tenant = x.tenant AND NOT x.wakes
        FOR NO KEY UPDATE OF ts SKIP LOCKED) f ON true;
    IF l_q IS NULL THEN
        RETURN 0;
    END IF;
    -- 2. The rows locked. A tenant that wakes: active again at the queue's virtual time (with
    -- its bounded debt) for a requeued job, its wake-up moved to its earliest retry if idle.
    IF cardinality(array_remove(h_rows, NULL)) > 0 THEN
        UPDATE {schema}.tenant_schedule ts
        SET running = ts.running - x.n,
            active = ts.active OR x.requeued,
            vtime = CASE WHEN NOT ts.active AND x.requeued
                         THEN greatest({schema}.queue_vtime(ts.queue),
                                       least(ts.vtime, {schema}.queue_vtime(ts.queue)
                                                       + greatest(1.0, 1.0 / ts.weight)))
                         WHEN ts.active AND x.corr <> 0.0
                         THEN ts.vtime + x.corr / {schema}.eff_weight(ts)
                         ELSE ts.vtime END,
            wake_at = CASE WHEN x.requeued THEN NULL
                           WHEN NOT ts.active AND x.retry_at IS NOT NULL
                           THEN least(ts.wake_at, x.retry_at)
                           ELSE ts.wake_at END,
            avg_run_s = {schema}.run_average(ts.avg_run_s, x.runs, x.run_sum)
        FROM unnest(h_rows, l_n, l_req, l_retry, l_corr, l_runs, l_sum)
            AS x(row_, n, requeued, retry_at, corr, runs, run_sum)
        WHERE ts.ctid = x.row_;
        GET DIAGNOSTICS written = ROW_COUNT;
    END IF;
    -- 3. The rows held elsewhere: the locks tried in key order (no wait), then a statement
    -- after them reads whether each tenant is capped as of now.
    IF EXISTS (SELECT FROM unnest(h_rows, l_wake) AS x(row_, wakes)
               WHERE x.row_ IS NULL AND NOT x.wakes) THEN
        WITH k AS (
            SELECT x.k, pg_catalog.pg_try_advisory_xact_lock_shared(1718710899, x.k) AS got
            FROM (SELECT DISTINCT {schema}.returns_lock(x.q, x.t) AS k
                  FROM unnest(l_q, l_t, h_rows, l_wake) AS x(q, t, row_, wakes)
                  WHERE x.row_ IS NULL AND NOT x.wakes
                  ORDER BY 1 OFFSET 0) x
        )
        SELECT array_agg(k.k) FILTER (WHERE NOT k.got) INTO busy FROM k;
        INSERT INTO {schema}.slot_returns (queue, tenant, n, corr, runs, run_sum, capped)
        SELECT x.q, x.t, x.n, x.corr, x.runs, x.run_sum,
               {schema}.returns_lock(x.q, x.t) = ANY (coalesce(busy, '{}'))
               OR coalesce((SELECT ts.running >= ts.max_running
                            FROM {schema}.tenant_schedule ts
                            WHERE ts.queue = x.q AND ts.tenant = x.t), false)
        FROM unnest(l_q, l_t, l_n, l_corr, l_runs, l_sum, h_rows, l_wake)
            AS x(q, t, n, corr, runs, run_sum, row_, wakes)
        WHERE x.row_ IS NULL AND NOT x.wakes;
    END IF;
    RETURN written;
END
$$;

-- A tenant's running jobs in a queue: its row's count less the slots given back to it and not
-- yet folded in, and less the slots counted ahead for workers (claim.sql) not started yet. For
-- readers (tests, operators' queries); the claims read the row's count.
CREATE OR REPLACE FUNCTION {schema}.tenant_running(ts {schema}.tenant_schedule) RETURNS int
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$ SELECT ts.running OPERATOR(pg_catalog.-) coalesce((
          SELECT sum(r.n) FROM {schema}.slot_returns r
          WHERE r.queue OPERATOR(pg_catalog.=) ts.queue
            AND r.tenant OPERATOR(pg_catalog.=) ts.tenant), 0)::int
          OPERATOR(pg_catalog.-) coalesce((
          SELECT sum(b.slots) FROM {schema}.claim_budgets b
          WHERE b.queue OPERATOR(pg_catalog.=) ts.queue
            AND b.tenant OPERATOR(pg_catalog.=) ts.tenant), 0)::int $$;
