-- Not a claim: a floor for a one-tenant fair claim, the least a plpgsql claim of the first
-- runnable tenant does (probe the sleepers, lock the tenant, pick and mark its jobs, settle);
-- no emptied check (due_after_job is given no job), no window, no wait. Only for claim_pair.py
-- at one tenant. Use: claim_pair.py --shapes 1x8000
--   --setup benchmarks/candidates/one_tenant_floor.sql
--   --variant floor=benchmarks/candidates/one_tenant_floor_call.sql
CREATE FUNCTION {schema}.candidate_one_tenant_floor(q text, lim int, win float8, wk text)
RETURNS SETOF {schema}.jobs LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    r record;
    n int;
    lastid bigint;
    emptied bool;
BEGIN
    PERFORM 1 FROM {schema}.tenant_schedule s
     WHERE s.queue = q AND NOT s.active AND s.wake_at <= now() LIMIT 1;
    SELECT ts.ctid AS row_, ts.tenant, ts.vtime, ts.weight, {schema}.claim_room(ts) AS room INTO r
      FROM {schema}.tenant_schedule ts
     WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
     ORDER BY ts.vtime, ts.tenant LIMIT 1
     FOR NO KEY UPDATE OF ts SKIP LOCKED;
    IF NOT FOUND THEN RETURN; END IF;
    n := least(r.room, lim);
    RETURN QUERY
    WITH p AS (SELECT q2.id FROM {schema}.jobs q2
               WHERE q2.queue = q AND q2.tenant = r.tenant AND q2.status = 'queued'
                 AND q2.run_at <= now()
               ORDER BY q2.priority DESC, q2.run_at, q2.id LIMIT n FOR UPDATE OF q2 SKIP LOCKED)
    UPDATE {schema}.jobs j
    SET status = 'running', attempts = j.attempts + 1, started_at = now(),
        locked_until = now() + make_interval(secs => j.lease_seconds), locked_by = wk
    WHERE j.id = ANY (ARRAY(SELECT p.id FROM p))
    RETURNING j.*;
    GET DIAGNOSTICS n = ROW_COUNT;
    SELECT max(j.id) INTO lastid FROM {schema}.jobs j WHERE false;
    emptied := NOT {schema}.due_after_job(q, r.tenant, lastid);
    PERFORM {schema}.claim_settle(q, false, NULL, NULL, NULL, ARRAY[r.row_], ARRAY[r.tenant::text],
        ARRAY[n], ARRAY[n / r.weight], '{}', '{}', '{}');
END
$$;
