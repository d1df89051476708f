-- Tenant groups and the effective weight. {schema} is the quoted schema name.
--
-- A tenant's weight in a claim is its effective weight: its own weight times its group's
-- factor in the queue, the group's weight over the summed weights of the group's competing
-- tenants (docs/algorithm.md, "Tenant groups"). Tenants without a group are in the group
-- 'default', weight 1 unless set. So a group's tenants together weigh what the group does,
-- whatever their number. The engine's factors are those of the queue's active tenants, kept
-- in group_schedule by refresh_groups; the exporter's are those of the backlogged tenants it
-- judges fairness over (fairq/sql/metrics.sql, exporter_tenants).

-- The effective weight: the one definition, which every use calls. No factor (no group
-- configured, or a group not refreshed yet): the tenant's own weight. A tenant's share of its
-- group is at most the group's weight, so at most 1000 (fairq.validation): the cap holds that
-- whatever group_schedule holds. IMMUTABLE sql with no subquery, so PostgreSQL inlines it into
-- the calling statement: the claim's walk calls it on every tenant it reads, where a plpgsql
-- call per tenant measured costly. A SET clause would stop the inlining, so it sets no
-- search_path; its body names nothing through one (rate_limits.sql says how).
CREATE OR REPLACE FUNCTION {schema}.effective_weight(weight float8, factor float8) RETURNS float8
LANGUAGE sql IMMUTABLE AS $$
    SELECT LEAST(weight OPERATOR(pg_catalog.*) COALESCE(factor, 1::pg_catalog.float8),
                 1000::pg_catalog.float8)
$$;

-- A tenant's effective weight now, with its group's factor from group_schedule.
-- plpgsql, not sql: a sql function with a subquery is never inlined, and runs as a statement
-- of its own, planned on each call; plpgsql's statements keep their (generic) plans.
CREATE OR REPLACE FUNCTION {schema}.eff_weight(s {schema}.tenant_schedule) RETURNS float8
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    q text := s.queue;
    grp text := coalesce(s.tenant_group, 'default');
    f float8;
BEGIN
    SELECT g.factor INTO f FROM {schema}.group_schedule g
    WHERE g.queue = q AND g.tenant_group = grp;
    RETURN {schema}.effective_weight(s.weight, f);
END
$$;

-- The factors of a queue's groups, recomputed from its active tenants (both partial indexes:
-- runnable and capped). Called by claim_settle at most once a second per queue, by one claim at
-- a time, and only while some group is configured. SECURITY DEFINER: it runs as the schema's
-- owner, the only role that writes group_schedule; a worker (which calls it through its claim)
-- gets EXECUTE on it (fairq/sql/roles.sql) and nothing to write there, so it cannot pick a
-- factor: this computes them from the tenants' configuration.
CREATE OR REPLACE FUNCTION {schema}.refresh_groups(q text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM {schema}.group_schedule g WHERE g.queue = q;
    INSERT INTO {schema}.group_schedule (queue, tenant_group, factor, refreshed_at)
    SELECT q, a.grp, coalesce((SELECT tg.weight FROM {schema}.tenant_groups tg
                               WHERE tg.tenant_group = a.grp), 1.0) / sum(a.weight), now()
    FROM (SELECT coalesce(ts.tenant_group, 'default') AS grp, ts.weight
          FROM {schema}.tenant_schedule ts
          WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
          UNION ALL
          SELECT coalesce(ts.tenant_group, 'default'), ts.weight
          FROM {schema}.tenant_schedule ts
          WHERE ts.queue = q AND ts.active AND ts.running >= ts.max_running) a
    GROUP BY a.grp;
    IF NOT FOUND THEN  -- no active tenant: a marker row, so the next refresh waits a second
        INSERT INTO {schema}.group_schedule (queue, tenant_group, factor, refreshed_at)
        VALUES (q, '', 1.0, now());
    END IF;
END
$$;

-- Whether this claim should refresh its queue's group factors: some group is configured, the
-- last refresh is a second old (or stamped more than a minute ahead: a clock set back), and no
-- other claim is refreshing them. One statement: without any group, its first test is all a
-- claim pays.
CREATE OR REPLACE FUNCTION {schema}.groups_due(q text) RETURNS bool
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM {schema}.tenant_groups)
        AND coalesce((SELECT max(g.refreshed_at) FROM {schema}.group_schedule g
                      WHERE g.queue = q), '-infinity')
            NOT BETWEEN now() - interval '1 second' AND now() + interval '1 minute'
        AND pg_try_advisory_xact_lock(hashtext('fairq.refresh_groups'), hashtext(q));
END
$$;

REVOKE EXECUTE ON FUNCTION {schema}.refresh_groups(text) FROM PUBLIC;
