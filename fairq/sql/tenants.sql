-- Tenant configuration (weights and caps) and its propagation to the schedule rows.

-- name: get_defaults
SELECT (value->>'weight')::float8 AS weight, (value->>'max_running')::int AS max_running,
       (value->>'rate')::float8 AS rate, (value->>'burst')::int AS burst
FROM {schema}.settings WHERE key = 'tenant_defaults';

-- name: set_defaults
INSERT INTO {schema}.settings (key, value)
VALUES ('tenant_defaults', jsonb_build_object('weight', %(weight)s::float8, 'max_running', %(max_running)s::int,
                                              'rate', %(rate)s::float8, 'burst', %(burst)s::int))
ON CONFLICT (key) DO UPDATE SET value = excluded.value;

-- name: upsert_tenant
INSERT INTO {schema}.tenants (tenant, weight, max_running, rate, burst, tenant_group, updated_at)
VALUES (%(tenant)s, %(weight)s, %(max_running)s, %(rate)s, %(burst)s, %(group)s, now())
ON CONFLICT (tenant) DO UPDATE
SET weight = excluded.weight, max_running = excluded.max_running, rate = excluded.rate,
    burst = excluded.burst, tenant_group = excluded.tenant_group, updated_at = now();

-- name: sync_tenant_schedule
-- Copy one tenant's configuration onto its schedule rows: the next claim sees it. When the rate
-- limit changes, the bucket is first refilled up to now under the old one (tokens earned stay
-- earned, capped by the new burst), and a tenant asleep in the future is woken by the next claim,
-- which retires it again at the next token under the new rate if it must. Its open throttled
-- interval is credited up to now under the old bucket, and goes on from now (under the new
-- one) while that bucket had no token yet (throttled_open, token_at).
UPDATE {schema}.tenant_schedule ts
SET weight = %(weight)s, max_running = %(max_running)s, rate = %(rate)s, burst = %(burst)s,
    tenant_group = %(group)s,
    tokens = CASE WHEN %(rate)s::float8 IS NOT NULL
                  THEN least(%(burst)s::int, {schema}.tenant_tokens(ts)) END,
    refilled_at = CASE WHEN %(rate)s::float8 IS NOT NULL AND ts.rate IS NOT NULL THEN now() END,
    throttled_seconds = ts.throttled_seconds + {schema}.throttled_open(ts),
    throttled_since = CASE WHEN ts.throttled_since IS NOT NULL AND %(rate)s::float8 IS NOT NULL
                                AND {schema}.token_at(ts) > now()
                           THEN greatest(now(), ts.throttled_since) END,
    wake_at = CASE WHEN NOT ts.active AND ts.wake_at > now()
                        AND (ts.rate IS DISTINCT FROM %(rate)s::float8
                             OR ts.burst IS DISTINCT FROM %(burst)s::int)
                   THEN least(ts.wake_at, now()) ELSE ts.wake_at END
WHERE ts.tenant = %(tenant)s
  AND (ts.weight <> %(weight)s OR ts.max_running <> %(max_running)s
       OR ts.rate IS DISTINCT FROM %(rate)s::float8 OR ts.burst IS DISTINCT FROM %(burst)s::int
       OR ts.tenant_group IS DISTINCT FROM %(group)s::text);

-- name: sync_default_tenants
-- Tenants without their own configuration follow the defaults (the rate as above).
UPDATE {schema}.tenant_schedule ts
SET weight = %(weight)s, max_running = %(max_running)s, rate = %(rate)s, burst = %(burst)s,
    tokens = CASE WHEN %(rate)s::float8 IS NOT NULL
                  THEN least(%(burst)s::int, {schema}.tenant_tokens(ts)) END,
    refilled_at = CASE WHEN %(rate)s::float8 IS NOT NULL AND ts.rate IS NOT NULL THEN now() END,
    throttled_seconds = ts.throttled_seconds + {schema}.throttled_open(ts),
    throttled_since = CASE WHEN ts.throttled_since IS NOT NULL AND %(rate)s::float8 IS NOT NULL
                                AND {schema}.token_at(ts) > now()
                           THEN greatest(now(), ts.throttled_since) END,
    wake_at = CASE WHEN NOT ts.active AND ts.wake_at > now()
                        AND (ts.rate IS DISTINCT FROM %(rate)s::float8
                             OR ts.burst IS DISTINCT FROM %(burst)s::int)
                   THEN least(ts.wake_at, now()) ELSE ts.wake_at END
WHERE NOT EXISTS (SELECT 1 FROM {schema}.tenants t WHERE t.tenant = ts.tenant)
  AND (ts.weight <> %(weight)s OR ts.max_running <> %(max_running)s
       OR ts.rate IS DISTINCT FROM %(rate)s::float8 OR ts.burst IS DISTINCT FROM %(burst)s::int);

-- name: get_tenant
SELECT t.tenant, t.weight, t.max_running, true AS configured, t.rate, t.burst,
       t.tenant_group AS "group", t.version
FROM {schema}.tenants t WHERE t.tenant = %(tenant)s;

-- name: lock_settings
-- The settings locks a change takes first in its transaction (engine: settings.sql): tenants
-- NULL, the defaults' own (a change of the defaults); else each tenant's, exclusive.
SELECT {schema}.lock_settings(%(tenants)s::text[], true);

-- name: patch_tenant
-- One tenant's settings changed in one statement: the fields `fields` names take the values
-- given, the others keep what the row holds now (a tenant without settings starts from the
-- defaults), so two operators changing different fields never undo each other. A new rate
-- keeps the bucket's size; a first one gets one second's worth (at least one); no rate, no
-- burst. With `expected` (the version a person's form showed; 0: no settings of its own), a
-- tenant whose settings changed since writes nothing and returns no row.
WITH d AS (
    SELECT (s.value->>'weight')::float8 AS weight, (s.value->>'max_running')::int AS max_running,
           (s.value->>'rate')::float8 AS rate, (s.value->>'burst')::int AS burst
    FROM {schema}.settings s WHERE s.key = 'tenant_defaults'
),
p AS (
    SELECT %(fields)s::text[] AS f, %(weight)s::float8 AS weight,
           %(max_running)s::int AS max_running, %(rate)s::float8 AS rate, %(burst)s::int AS burst,
           %(group)s::text AS grp
)
INSERT INTO {schema}.tenants AS t (tenant, weight, max_running, rate, burst, tenant_group,
                                  updated_at)
SELECT %(tenant)s::text,
       CASE WHEN 'weight' = ANY(p.f) THEN p.weight ELSE coalesce(d.weight, 1.0) END,
       CASE WHEN 'max_running' = ANY(p.f) THEN p.max_running ELSE coalesce(d.max_running, 10) END,
       CASE WHEN 'rate' = ANY(p.f) THEN p.rate ELSE d.rate END,
       CASE WHEN 'burst' = ANY(p.f) THEN p.burst
            WHEN 'rate' = ANY(p.f) THEN CASE WHEN p.rate IS NULL THEN NULL
                                             WHEN d.rate IS NOT NULL THEN d.burst
                                             ELSE greatest(1, ceil(p.rate))::int END
            ELSE d.burst END,
       CASE WHEN 'group' = ANY(p.f) THEN p.grp END,
       now()
FROM p LEFT JOIN d ON true
-- A row to insert unless the edit was made on settings that are gone (a version > 0, no row);
-- with a row, the conflict below updates it if its version is the one expected.
WHERE coalesce(%(expected)s::bigint, 0) = 0
   OR EXISTS (SELECT FROM {schema}.tenants o WHERE o.tenant = %(tenant)s::text)
ON CONFLICT (tenant) DO UPDATE
SET weight = CASE WHEN 'weight' = ANY(%(fields)s::text[]) THEN excluded.weight ELSE t.weight END,
    max_running = CASE WHEN 'max_running' = ANY(%(fields)s::text[]) THEN excluded.max_running
                       ELSE t.max_running END,
    rate = CASE WHEN 'rate' = ANY(%(fields)s::text[]) THEN excluded.rate ELSE t.rate END,
    burst = CASE WHEN 'burst' = ANY(%(fields)s::text[]) THEN excluded.burst
                 WHEN 'rate' = ANY(%(fields)s::text[])
                     THEN CASE WHEN excluded.rate IS NULL THEN NULL
                               WHEN t.rate IS NOT NULL THEN t.burst
                               ELSE greatest(1, ceil(excluded.rate))::int END
                 ELSE t.burst END,
    tenant_group = CASE WHEN 'group' = ANY(%(fields)s::text[]) THEN excluded.tenant_group
                        ELSE t.tenant_group END,
    updated_at = now()
WHERE %(expected)s::bigint IS NULL OR t.version = %(expected)s::bigint
RETURNING t.tenant, t.weight, t.max_running, true AS configured, t.rate, t.burst,
          t.tenant_group AS "group", t.version;

-- name: tenant_version
-- The version of a tenant's settings now (no row: it has none), for a refused edit's message.
SELECT t.version FROM {schema}.tenants t WHERE t.tenant = %(tenant)s;

-- name: group_exists
SELECT EXISTS (SELECT FROM {schema}.tenant_groups g WHERE g.tenant_group = %(group)s) AS found;

-- name: list_tenants
-- Every tenant fairq knows (configured or seen in a queue), with its effective settings. One
-- pass over each table, grouped by tenant (a hash aggregate and one sort), so the work is linear
-- in tenants: a join or a correlated sum by tenant would be read per tenant, as neither the
-- schedule's key (queue, tenant) nor fairq's planner settings (no hash or merge joins) give
-- anything better than a walk of the whole table for each.
WITH d AS (
    SELECT (value->>'weight')::float8 AS weight, (value->>'max_running')::int AS max_running,
           (value->>'rate')::float8 AS rate, (value->>'burst')::int AS burst
    FROM {schema}.settings WHERE key = 'tenant_defaults'
),
known AS (
    SELECT x.tenant, bool_or(x.configured) AS configured, sum(x.running) AS running,
           max(x.weight) AS weight, max(x.max_running) AS max_running, max(x.rate) AS rate,
           max(x.burst) AS burst, max(x.tenant_group) AS tenant_group, max(x.version) AS version
    FROM (
        SELECT ts.tenant, false AS configured, ts.running, NULL::float8 AS weight,
               NULL::int AS max_running, NULL::float8 AS rate, NULL::int AS burst,
               NULL::text AS tenant_group, NULL::bigint AS version
        FROM {schema}.tenant_schedule ts
        UNION ALL  -- slots given back but not yet folded into `running` (slots.sql)
        SELECT r.tenant, false, -r.n, NULL, NULL, NULL, NULL, NULL, NULL
        FROM {schema}.slot_returns r
        UNION ALL  -- slots counted ahead for workers, not started yet (claim.sql)
        SELECT b.tenant, false, -b.slots, NULL, NULL, NULL, NULL, NULL, NULL
        FROM {schema}.claim_budgets b
        UNION ALL
        SELECT t.tenant, true, 0, t.weight, t.max_running, t.rate, t.burst, t.tenant_group,
               t.version
        FROM {schema}.tenants t
    ) x
    GROUP BY x.tenant
)
SELECT k.tenant, CASE WHEN k.configured THEN k.weight ELSE d.weight END AS weight,
       CASE WHEN k.configured THEN k.max_running ELSE d.max_running END AS max_running,
       k.configured, k.running::int AS running,
       CASE WHEN k.configured THEN k.rate ELSE d.rate END AS rate,
       CASE WHEN k.configured THEN k.burst ELSE d.burst END AS burst,
       k.tenant_group AS "group", coalesce(k.version, 0) AS version
FROM known k LEFT JOIN d ON true
ORDER BY k.tenant;

-- name: upsert_group
INSERT INTO {schema}.tenant_groups (tenant_group, weight, updated_at)
VALUES (%(group)s, %(weight)s, now())
ON CONFLICT (tenant_group) DO UPDATE SET weight = excluded.weight, updated_at = now();

-- name: expire_group_factors
-- A group's weight changed: every queue's factors are recomputed by its next claim.
UPDATE {schema}.group_schedule SET refreshed_at = '-infinity';

-- name: list_groups
-- Every configured group, and the group 'default' of the tenants without one (weight 1 unless
-- configured), with how many tenants are in it: those with settings of their own and those
-- known only by their jobs (in tenant_schedule), each counted once. One pass over the tenants,
-- grouped (a count per group by a correlated subquery would read every tenant once per group).
SELECT x.name, coalesce(max(x.weight), 1.0) AS weight, bool_or(x.configured) AS configured,
       sum(x.tenants)::int AS tenants
FROM (
    SELECT tg.tenant_group AS name, tg.weight, true AS configured, true AS listed, 0 AS tenants
    FROM {schema}.tenant_groups tg
    UNION ALL
    SELECT 'default', NULL, false, true, 0
    UNION ALL
    SELECT coalesce(t.tenant_group, 'default'), NULL, false, false, 1 FROM {schema}.tenants t
    UNION ALL
    SELECT coalesce(min(ts.tenant_group), 'default'), NULL, false, false, 1
    FROM {schema}.tenant_schedule ts
    WHERE NOT EXISTS (SELECT 1 FROM {schema}.tenants t WHERE t.tenant = ts.tenant)
    GROUP BY ts.tenant
) x
GROUP BY x.name
HAVING bool_or(x.listed)
ORDER BY x.name;
