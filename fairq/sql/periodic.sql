-- Periodic schedules (fairq.periodic): the last tick enqueued per (name, tenant). Times are the
-- database's: workers compute ticks from the now() these statements return.

-- name: periodic_state
-- The database clock and the last tick of each of these schedules (NULL: never seen); one row
-- with a NULL name when there are none.
SELECT now() AS now, s.name, s.tenant, s.last_tick
FROM (SELECT 1) AS one LEFT JOIN (
    SELECT i.name, i.tenant, p.last_tick
    FROM unnest(%(names)s::text[], %(tenants)s::text[]) AS i(name, tenant)
    LEFT JOIN {schema}.periodic p ON p.name = i.name AND p.tenant = i.tenant
) s ON true;

-- name: periodic_register
-- A schedule seen for the first time starts from its latest tick without enqueueing it: its
-- first job is for the next tick. Whoever inserts first wins; the others change nothing.
INSERT INTO {schema}.periodic (name, tenant, task, cron, last_tick)
VALUES (%(name)s, %(tenant)s, %(task)s, %(cron)s, %(tick)s)
ON CONFLICT (name, tenant) DO NOTHING
RETURNING name;

-- name: periodic_claim
-- Claim a tick: only for the worker whose update moves last_tick forward. A second worker
-- claiming the same tick waits for the first one's transaction (the row lock), then finds
-- last_tick no longer earlier and updates nothing. The caller enqueues the tick's job in the
-- same transaction, so a claimed tick always has its job and a failed enqueue claims nothing.
UPDATE {schema}.periodic
SET last_tick = %(tick)s, task = %(task)s, cron = %(cron)s, updated_at = now()
WHERE name = %(name)s AND tenant = %(tenant)s AND last_tick < %(tick)s AND %(tick)s <= now()
RETURNING name;

-- name: periodic_set_job
UPDATE {schema}.periodic SET last_job_id = %(job_id)s
WHERE name = %(name)s AND tenant = %(tenant)s;

-- name: periodic_list
-- Every schedule's row, and the database clock (one row with a NULL name when there are none).
SELECT now() AS now, p.name, p.tenant, p.task, p.cron, p.last_tick, p.last_job_id
FROM (SELECT 1) AS one LEFT JOIN {schema}.periodic p ON true
ORDER BY p.name, p.tenant;
