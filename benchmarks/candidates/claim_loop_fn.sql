-- Candidate, NOT a correct claim in general: the fair claim as a plpgsql loop over the walk
-- (one FETCH and one pick per tenant, one UPDATE for all), to price that design. Missing: the
-- sleepers in the walk (they are locked and woken, not served), the wait (a claim that finds
-- every row held returns nothing), the stop (claim_settle is never given one), drr's cost and
-- the group factor in the pick size. Fine for claim_pair.py's shapes (one claimer, no delays,
-- no caps, no groups). Use: claim_pair.py --setup benchmarks/candidates/claim_loop_fn.sql
--   --variant loop=benchmarks/candidates/claim_loop_fn_call.sql
CREATE FUNCTION {schema}.candidate_claim_loop(q text, lim int, by_weight bool, by_cost bool,
                                         win float8, waiting bool, wk text)
RETURNS SETOF {schema}.jobs
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    sl_rows tid[] := '{}';
    sl_tenants text[] := '{}';
    hi float8;
    walk refcursor;
    r record;
    n int;
    ids bigint[];
    all_ids bigint[] := '{}';
    got {schema}.jobs[];
    lj {schema}.jobs;
    s_rows tid[] := '{}';
    s_tenants text[] := '{}';
    s_n int[] := '{}';
    s_inc float8[] := '{}';
    s_most int[] := '{}';
    s_last bigint[] := '{}';
    s_empty text[] := '{}';
    took int := 0;
BEGIN
    SELECT coalesce(array_agg(x.ctid), '{}'), coalesce(array_agg(x.tenant), '{}')
    INTO sl_rows, sl_tenants
    FROM (SELECT s.ctid, s.tenant FROM {schema}.tenant_schedule s
          WHERE s.queue = q AND NOT s.active AND s.wake_at <= now()
          ORDER BY s.wake_at FOR NO KEY UPDATE OF s SKIP LOCKED) x;
    SELECT ts.vtime + win INTO hi FROM {schema}.tenant_schedule ts
    WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
    ORDER BY ts.vtime LIMIT 1;
    OPEN walk FOR
        SELECT ts.ctid, ts.tenant, ts.vtime,
               CASE WHEN by_weight THEN {schema}.eff_weight(ts) ELSE 1.0 END AS w,
               {schema}.claim_room(ts) AS room
        FROM {schema}.tenant_schedule ts
        WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running AND ts.vtime <= hi
        ORDER BY ts.vtime, ts.tenant LIMIT 1000
        FOR NO KEY UPDATE OF ts SKIP LOCKED;
    LOOP
        FETCH walk INTO r;
        EXIT WHEN NOT FOUND;
        n := least(r.room, greatest(1, floor((hi - r.vtime) * r.w) + 1)::int);
        ids := array(SELECT pj.id FROM {schema}.jobs pj
                     WHERE pj.queue = q AND pj.tenant = r.tenant
                       AND pj.status = 'queued' AND pj.run_at <= now()
                     ORDER BY pj.priority DESC, pj.run_at, pj.id
                     LIMIT least(n, lim - took)
                     FOR UPDATE OF pj SKIP LOCKED);
        IF cardinality(ids) > 0 THEN
            s_rows := s_rows || r.ctid;
            s_tenants := s_tenants || r.tenant;
            s_n := s_n || cardinality(ids);
            s_inc := s_inc || (cardinality(ids) / r.w);
            s_most := s_most || n;
            s_last := s_last || ids[cardinality(ids)];
            all_ids := all_ids || ids;
            took := took + cardinality(ids);
        END IF;
        EXIT WHEN took >= lim;
    END LOOP;
    CLOSE walk;
    WITH claimed AS (
        UPDATE {schema}.jobs cj
        SET status = 'running', attempts = cj.attempts + 1, started_at = now(),
            locked_until = now() + make_interval(secs => cj.lease_seconds), locked_by = wk
        WHERE cj.id = ANY (all_ids)
        RETURNING cj)
    SELECT array_agg(c.cj) INTO got FROM claimed c;
    FOR i IN 1 .. cardinality(s_rows) LOOP
        IF s_n[i] < s_most[i] AND NOT (took >= lim AND i = cardinality(s_rows)) THEN
            s_empty := s_empty || s_tenants[i];
            CONTINUE;
        END IF;
        FOREACH lj IN ARRAY got LOOP
            EXIT WHEN lj.id = s_last[i];
        END LOOP;
        IF NOT EXISTS (SELECT FROM {schema}.jobs j
                       WHERE j.queue = q AND j.tenant = s_tenants[i]
                         AND j.status = 'queued' AND j.run_at <= now()
                         AND j.priority = lj.priority AND (j.run_at, j.id) > (lj.run_at, lj.id))
           AND NOT EXISTS (SELECT FROM {schema}.jobs j
                       WHERE j.queue = q AND j.tenant = s_tenants[i]
                         AND j.status = 'queued' AND j.run_at <= now()
                         AND j.priority < lj.priority) THEN
            s_empty := s_empty || s_tenants[i];
        END IF;
    END LOOP;
    PERFORM {schema}.claim_settle(q, took < lim AND NOT waiting, hi, NULL, NULL,
                                  s_rows, s_tenants, s_n, s_inc, s_empty, sl_rows, sl_tenants);
    IF took > 0 THEN
        RETURN QUERY SELECT * FROM unnest(got);
    END IF;
END
$$;
