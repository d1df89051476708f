-- Tenant configuration (weights and caps) and its propagation to the schedule rows.

-- name: get_defaults
SELECT (value->>'weight')::float8 AS weight, (value->>'max_running')::int AS max_running
FROM {schema}.settings WHERE key = 'tenant_defaults';

-- name: set_defaults
INSERT INTO {schema}.settings (key, value)
VALUES ('tenant_defaults', jsonb_build_object('weight', %(weight)s::float8, 'max_running', %(max_running)s::int))
ON CONFLICT (key) DO UPDATE SET value = excluded.value;

-- name: upsert_tenant
INSERT INTO {schema}.tenants (tenant, weight, max_running, updated_at)
VALUES (%(tenant)s, %(weight)s, %(max_running)s, now())
ON CONFLICT (tenant) DO UPDATE
SET weight = excluded.weight, max_running = excluded.max_running, updated_at = now();

-- name: sync_tenant_schedule
-- Copy one tenant's configuration onto its schedule rows: the next claim sees it.
UPDATE {schema}.tenant_schedule ts
SET weight = %(weight)s, max_running = %(max_running)s
WHERE ts.tenant = %(tenant)s AND (ts.weight <> %(weight)s OR ts.max_running <> %(max_running)s);

-- name: sync_default_tenants
-- Tenants without their own configuration follow the defaults.
UPDATE {schema}.tenant_schedule ts
SET weight = %(weight)s, max_running = %(max_running)s
WHERE NOT EXISTS (SELECT 1 FROM {schema}.tenants t WHERE t.tenant = ts.tenant)
  AND (ts.weight <> %(weight)s OR ts.max_running <> %(max_running)s);

-- name: get_tenant
SELECT t.tenant, t.weight, t.max_running, true AS configured
FROM {schema}.tenants t WHERE t.tenant = %(tenant)s;

-- name: list_tenants
-- Every tenant fairq knows (configured or seen in a queue), with its effective settings.
WITH d AS (
    SELECT (value->>'weight')::float8 AS weight, (value->>'max_running')::int AS max_running
    FROM {schema}.settings WHERE key = 'tenant_defaults'
),
names AS (
    SELECT tenant FROM {schema}.tenants
    UNION SELECT DISTINCT tenant FROM {schema}.tenant_schedule
)
SELECT n.tenant, coalesce(t.weight, d.weight) AS weight,
       coalesce(t.max_running, d.max_running) AS max_running,
       t.tenant IS NOT NULL AS configured,
       coalesce((SELECT sum(ts.running) FROM {schema}.tenant_schedule ts WHERE ts.tenant = n.tenant), 0)::int AS running
FROM names n LEFT JOIN {schema}.tenants t ON t.tenant = n.tenant CROSS JOIN d
ORDER BY n.tenant;
