-- Usage decay for workers with a half-life (WorkerSettings.time_half_life). {schema} is the
-- quoted schema name.

-- A queue's active tenants ahead of its virtual time V have their lead over V multiplied by
-- `factor` (in (0, 1]): service received long ago weighs less, as if each tenant's usage decayed
-- with a half-life. Tenants at or behind V are left alone, so the order at the front of the
-- queue, and V itself, do not move. Each row is written by an UPDATE of its own, in tenant order,
-- as return_slots writes them (docs/decisions/012): a row locked and then updated by one
-- statement can deadlock with a claim. Returns how many rows it wrote.
CREATE OR REPLACE FUNCTION {schema}.decay_usage(q text, factor float8) RETURNS int
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v float8 := {schema}.queue_vtime(q);
    t text;
    ahead text[];
    written int := 0;
BEGIN
    IF factor IS NULL OR NOT (factor > 0 AND factor <= 1) THEN
        RAISE EXCEPTION USING MESSAGE = 'decay factor must be in (0, 1], not '
                                        || coalesce(factor::text, 'NULL');
    END IF;
    -- The tenants ahead of V, from the runnable and the capped indexes (a range each, past V),
    -- never the queue's whole primary key (read in the indexes' order, so that only they can
    -- serve it); then written in tenant order.
    ahead := array(SELECT ts.tenant FROM {schema}.tenant_schedule ts
                   WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
                     AND ts.vtime > v
                   ORDER BY ts.vtime, ts.tenant);
    ahead := ahead || array(SELECT ts.tenant FROM {schema}.tenant_schedule ts
                            WHERE ts.queue = q AND ts.active AND ts.running >= ts.max_running
                              AND ts.vtime > v
                            ORDER BY ts.vtime);
    FOR t IN SELECT u.t FROM unnest(ahead) AS u(t) ORDER BY u.t
    LOOP
        UPDATE {schema}.tenant_schedule ts SET vtime = v + (ts.vtime - v) * factor
        WHERE ts.queue = q AND ts.tenant = t AND ts.active AND ts.vtime > v;
        written := written + 1;
    END LOOP;
    RETURN written;
END
$$;
