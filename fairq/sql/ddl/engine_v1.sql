-- The fair engine's functions, created by migration 0003. {schema} is the quoted schema name.
-- This file is part of the schema's history: never edit it once released; a change is a new
-- file (engine_v2.sql) and a new migration.

-- The queue's virtual time V, where a tenant that becomes runnable starts (enqueue, a delayed
-- job falling due, a job handed back): the minimum vtime of the runnable tenants; if every
-- active tenant is at its cap, the maximum of theirs; if no tenant is active, 0. So an idle
-- tenant comes back with neither credit nor debt, and an idle queue starts afresh.
-- The one definition of it: every statement that activates a tenant calls this.
CREATE FUNCTION {schema}.queue_vtime(q text) RETURNS float8
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v float8;
BEGIN
    SELECT ts.vtime INTO v FROM {schema}.tenant_schedule ts
    WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
    ORDER BY ts.vtime LIMIT 1;
    IF v IS NULL THEN
        SELECT ts.vtime INTO v FROM {schema}.tenant_schedule ts
        WHERE ts.queue = q AND ts.active AND ts.running >= ts.max_running
        ORDER BY ts.vtime DESC LIMIT 1;
    END IF;
    RETURN coalesce(v, 0);
END
$$;

-- The tenants a fair claim waits for when its walk took nothing although work is due: the
-- first `n` runnable tenants in (vtime, tenant) order with a due job, read with a fresh snapshot
-- (VOLATILE): the claim's own snapshot may still show tenants that other claims emptied and
-- retired since. More than one, because the first may be emptied by the claim that holds it.
CREATE FUNCTION {schema}.claim_head(q text, n int) RETURNS text[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    ts_ text[];
BEGIN
    SELECT array_agg(h.tenant ORDER BY h.vtime, h.tenant) INTO ts_ FROM (
        SELECT ts.tenant, ts.vtime FROM {schema}.tenant_schedule ts
        WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
          AND (SELECT true FROM {schema}.jobs j
               WHERE j.queue = q AND j.tenant = ts.tenant AND j.status = 'queued'
                 AND j.run_at <= now() LIMIT 1)
        ORDER BY ts.vtime, ts.tenant
        LIMIT n) h;
    RETURN coalesce(ts_, '{}');
END
$$;

-- The end of a fair claim (fairq/sql/claim.sql), once its jobs are marked running: the tenant
-- rows it holds get their counts and virtual times, then every tenant it served or walked past
-- that looks empty leaves the runnable set if it has no due job left.
--
-- Why a function: each statement of a VOLATILE function gets a fresh snapshot under READ
-- COMMITTED, which the claim's own statement cannot have.
-- - The rows are written by ctid (a TID scan, a plan no statistics can change). A row the claim
--   locked after waiting for it, or after another claim changed it, is newer than the claim's
--   snapshot; only a later snapshot sees it.
-- - Leaving the runnable set must not race an enqueue. A producer holds FOR KEY SHARE on its
--   tenants' rows until it commits (see enqueue); retiring takes FOR UPDATE, which conflicts,
--   SKIP LOCKED (a tenant whose producer has not committed stays runnable). Only once that lock
--   is held is "no due job" decided, with a snapshot taken after it: a job committed before the
--   lock is seen; a producer that locks after it waits, finds the tenant retired and wakes it.
-- The job probes are subqueries whose index condition is the tenant itself.
CREATE FUNCTION {schema}.claim_settle(
    q text, rows_ tid[], ns int[], incs float8[], woken bool[], v float8, suspects text[]
) RETURNS int
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    locked tid[];
    retired int;
BEGIN
    -- Rows this claim holds (FOR NO KEY UPDATE): served tenants, and sleepers woken at V.
    UPDATE {schema}.tenant_schedule ts
    SET running = ts.running + x.n, claimed_total = ts.claimed_total + x.n,
        vtime = CASE WHEN x.woken THEN v ELSE ts.vtime END + x.inc,
        active = true, wake_at = CASE WHEN x.woken THEN NULL ELSE ts.wake_at END,
        last_served_at = CASE WHEN x.n > 0 THEN now() ELSE ts.last_served_at END
    FROM unnest(rows_, ns, incs, woken) AS x(row_, n, inc, woken)
    WHERE ts.ctid = x.row_;

    IF cardinality(suspects) = 0 THEN
        RETURN 0;
    END IF;
    SELECT array_agg(x.ctid) INTO locked
    FROM (SELECT DISTINCT u.t FROM unnest(suspects) AS u(t) ORDER BY u.t) u
    CROSS JOIN LATERAL (
        SELECT ts.ctid FROM {schema}.tenant_schedule ts
        WHERE ts.queue = q AND ts.tenant = u.t AND ts.active
          AND (SELECT true FROM {schema}.jobs j
               WHERE j.queue = q AND j.tenant = u.t AND j.status = 'queued'
                 AND j.run_at <= now() LIMIT 1) IS NULL
        FOR UPDATE OF ts SKIP LOCKED) x;
    IF locked IS NULL THEN
        RETURN 0;
    END IF;
    -- The fresh snapshot: retire those that still have no due job.
    UPDATE {schema}.tenant_schedule ts
    SET active = false,
        wake_at = (SELECT j.run_at FROM {schema}.jobs j
                   WHERE j.queue = ts.queue AND j.tenant = ts.tenant AND j.status = 'queued'
                   ORDER BY j.run_at LIMIT 1)
    WHERE ts.ctid = ANY (locked)
      AND (SELECT true FROM {schema}.jobs j
           WHERE j.queue = ts.queue AND j.tenant = ts.tenant AND j.status = 'queued'
             AND j.run_at <= now() LIMIT 1) IS NULL;
    GET DIAGNOSTICS retired = ROW_COUNT;
    RETURN retired;
END
$$;
