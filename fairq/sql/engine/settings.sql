-- Tenant settings and the schedule rows that copy them (decision 020).
--
-- A schedule row copies its tenant's settings (or the defaults) when it is created, and every
-- settings change copies them again onto the rows that exist. Both read what is committed, so
-- without an order between them an enqueue creating a tenant's first row and a change of that
-- tenant's settings could each miss the other: the row would keep the old cap for good. The
-- order is a transaction-level advisory lock per tenant (and one for the defaults): whoever
-- creates schedule rows holds it shared, from before it reads the settings until it commits;
-- whoever changes settings holds it exclusive. Enqueues of tenants whose rows exist take none.

-- Take the settings locks: with `tenants` NULL, the defaults' lock alone (exclusive: a change of
-- the defaults); else the defaults' lock shared and each tenant's, shared or exclusive, in one
-- order every caller shares (the defaults first, then tenants by name), so that two callers can
-- only wait for each other, never deadlock. The keys are the schema's NOTIFY channel and the
-- tenant, hashed: a collision costs a wait, never a missed one.
CREATE OR REPLACE FUNCTION {schema}.lock_settings(tenants text[], exclusive boolean)
RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t text;
BEGIN
    IF tenants IS NULL THEN
        IF exclusive THEN
            PERFORM pg_advisory_xact_lock(hashtextextended({channel}, 0));
        ELSE
            PERFORM pg_advisory_xact_lock_shared(hashtextextended({channel}, 0));
        END IF;
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(hashtextextended({channel}, 0));
    FOR t IN SELECT DISTINCT u.t COLLATE "C" FROM unnest(tenants) AS u(t)
             WHERE u.t IS NOT NULL ORDER BY 1 LOOP
        IF exclusive THEN
            PERFORM pg_advisory_xact_lock(hashtextextended({channel} || ':' || t, 0));
        ELSE
            PERFORM pg_advisory_xact_lock_shared(hashtextextended({channel} || ':' || t, 0));
        END IF;
    END LOOP;
END
$$;

-- Create the schedule rows of these (queue, tenant) pairs that have none, from the tenant's
-- settings or the defaults, at the queue's virtual time V as a new tenant: active when the
-- pair's first job is due, else asleep until it is. The caller holds the tenants' settings
-- locks (lock_settings, shared) since a statement before this one, so the settings read here
-- are the ones in force until it commits. Returns how many rows it created.
CREATE OR REPLACE FUNCTION {schema}.ensure_schedule(queues text[], tenants text[],
                                                    first_runs timestamptz[])
RETURNS integer
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
    WITH defaults AS (
        SELECT (s.value->>'weight')::float8 AS weight, (s.value->>'max_running')::int AS max_running,
               (s.value->>'rate')::float8 AS rate, (s.value->>'burst')::int AS burst
        FROM {schema}.settings s WHERE s.key = 'tenant_defaults'
    ),
    made AS (
        INSERT INTO {schema}.tenant_schedule AS ts (queue, tenant, weight, max_running, vtime,
                                                   active, wake_at, rate, burst, tenant_group)
        SELECT p.queue, p.tenant, coalesce(t.weight, d.weight, 1.0),
               coalesce(t.max_running, d.max_running, 10),
               {schema}.queue_vtime(p.queue), p.first_run <= now(),
               CASE WHEN p.first_run > now() THEN p.first_run END,
               CASE WHEN t.tenant IS NOT NULL THEN t.rate ELSE d.rate END,
               CASE WHEN t.tenant IS NOT NULL THEN t.burst ELSE d.burst END, t.tenant_group
        FROM (SELECT u.queue, u.tenant, min(u.first_run) AS first_run
              FROM unnest(queues, tenants, first_runs) AS u(queue, tenant, first_run)
              GROUP BY 1, 2) p
        LEFT JOIN {schema}.tenants t ON t.tenant = p.tenant
        LEFT JOIN defaults d ON true
        ORDER BY p.queue, p.tenant
        ON CONFLICT (queue, tenant) DO NOTHING
        RETURNING ts.queue
    )
    SELECT count(*)::int FROM made
$$;

-- The maintenance's repair: queued jobs whose (queue, tenant) has no schedule row would wait
-- until another job of the tenant arrives in the queue (nothing claims a tenant it does not
-- know). Finds up to `lim` such pairs, by a walk over the distinct (queue, tenant) pairs of the
-- ready index (one index descent per pair), and creates their rows as an enqueue would. Returns
-- the pairs repaired. SECURITY DEFINER: the workers' role runs it and has no INSERT on the
-- schedule.
CREATE OR REPLACE FUNCTION {schema}.repair_schedule(lim integer)
RETURNS TABLE (queue text, tenant text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    o_queues text[];
    o_tenants text[];
    o_runs timestamptz[];
BEGIN
    WITH RECURSIVE pairs AS (
        (SELECT j.queue, j.tenant FROM {schema}.jobs j WHERE j.status = 'queued'
         ORDER BY j.queue, j.tenant LIMIT 1)
        UNION ALL
        SELECT n.queue, n.tenant FROM pairs p
        CROSS JOIN LATERAL (
            SELECT j.queue, j.tenant FROM {schema}.jobs j
            WHERE j.status = 'queued' AND (j.queue, j.tenant) > (p.queue, p.tenant)
            ORDER BY j.queue, j.tenant LIMIT 1) n
    ),
    orphans AS (
        SELECT p.queue, p.tenant FROM pairs p
        WHERE (SELECT true FROM {schema}.tenant_schedule s
               WHERE s.queue = p.queue AND s.tenant = p.tenant) IS NULL
        LIMIT lim
    )
    SELECT array_agg(o.queue ORDER BY o.queue, o.tenant),
           array_agg(o.tenant ORDER BY o.queue, o.tenant),
           array_agg((SELECT min(j.run_at) FROM {schema}.jobs j
                      WHERE j.queue = o.queue AND j.tenant = o.tenant AND j.status = 'queued')
                     ORDER BY o.queue, o.tenant)
    INTO o_queues, o_tenants, o_runs
    FROM orphans o;
    IF o_tenants IS NULL THEN
        RETURN;
    END IF;
    PERFORM {schema}.lock_settings(o_tenants, false);
    PERFORM {schema}.ensure_schedule(o_queues, o_tenants, o_runs);
    RETURN QUERY SELECT u.queue, u.tenant FROM unnest(o_queues, o_tenants) AS u(queue, tenant);
END
$$;

-- A tenant's settings count their changes, whoever writes them (the console, the CLI, a
-- tenants file, a release that knows nothing of versions): an edit a person made from what a
-- page showed names that version and is refused when another change came in between.
CREATE OR REPLACE FUNCTION {schema}.tenants_version() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    NEW.version := OLD.version + 1;
    RETURN NEW;
END
$$;
CREATE OR REPLACE TRIGGER tenants_version BEFORE UPDATE ON {schema}.tenants
    FOR EACH ROW EXECUTE FUNCTION {schema}.tenants_version();

REVOKE EXECUTE ON FUNCTION {schema}.lock_settings(text[], boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {schema}.ensure_schedule(text[], text[], timestamptz[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {schema}.repair_schedule(integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {schema}.tenants_version() FROM PUBLIC;
