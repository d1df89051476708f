-- The test mode's reads (fairq.testing): what a test enqueued, read on the test's own connection
-- when it gives one (so a job of its uncommitted transaction is seen). {schema} is the quoted
-- schema identifier; the rest are bound parameters.

-- name: testing_enqueued
-- The jobs matching every filter given (NULL: any), oldest first; a payload filter matches a
-- job whose payload contains it (jsonb @>: the keys given, with those values).
SELECT id, queue, tenant, task, payload, status, priority, cost, run_at, attempts, max_attempts,
       lease_seconds, locked_until, locked_by, last_error, created_at, started_at, finished_at,
       result
FROM {schema}.jobs
WHERE (%(task)s::text IS NULL OR task = %(task)s::text)
  AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
  AND (%(payload)s::jsonb IS NULL OR payload @> %(payload)s::jsonb)
ORDER BY id
LIMIT %(limit)s;

-- name: testing_due
-- How many of a tenant's jobs in these queues are due now (drain's tenant= ends at none).
SELECT count(*) AS n FROM {schema}.jobs
WHERE queue = ANY(%(queues)s::text[]) AND tenant = %(tenant)s AND status = 'queued'
  AND run_at <= now();

