-- Tenant wake-ups, run by the workers' maintenance (fairq/runtime/maintenance.py): an idle tenant
-- becomes runnable again at the current virtual time of its queue, plus what it still owes of
-- its last job (queue_vtime, vtime.sql). {schema} is the quoted schema
-- identifier; the rest are bound parameters.

-- name: wake_due_tenants
-- Maintenance: idle tenants whose delayed jobs or retries are now due become runnable again,
-- at the current virtual time of their queue (no banked credit; vtime.sql).
UPDATE {schema}.tenant_schedule ts
SET active = true, wake_at = NULL,
    vtime = greatest({schema}.queue_vtime(ts.queue),
                     least(ts.vtime, {schema}.queue_vtime(ts.queue) + greatest(1.0, 1.0 / ts.weight)))
WHERE NOT ts.active AND ts.wake_at <= now()
RETURNING ts.queue, ts.tenant;

-- name: wake_stranded_tenants
-- Maintenance safety net, run rarely: an idle tenant whose due job committed while a claimer
-- was concluding it had none. O(idle tenants); the wake_at path above is the common one. A
-- rate-limited tenant waiting for its next token (tenant_dry) is idle on purpose. It reads the
-- table: the idle-tenant indexes hold only tenants with a wake-up, and a stranded tenant
-- often has none.
UPDATE {schema}.tenant_schedule ts
SET active = true, wake_at = NULL,
    vtime = greatest({schema}.queue_vtime(ts.queue),
                     least(ts.vtime, {schema}.queue_vtime(ts.queue) + greatest(1.0, 1.0 / ts.weight)))
WHERE NOT ts.active AND NOT {schema}.tenant_dry(ts) AND EXISTS (
    SELECT 1 FROM {schema}.jobs q
    WHERE q.queue = ts.queue AND q.tenant = ts.tenant AND q.status = 'queued' AND q.run_at <= now())
RETURNING ts.queue, ts.tenant;
