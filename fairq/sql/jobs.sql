-- Job lifecycle statements. {schema} is the quoted schema identifier; the rest are bound
-- parameters. Every finish, failure, extend and hand-back is fenced on (id, status = 'running',
-- attempts, started_at): a worker that lost its lease changes nothing. started_at is the claim's
-- now(), which the claim returned to the worker (%(started)s; NULL: attempts alone, for callers
-- that claimed by hand): after a fail-over to an asynchronous standby the new primary may hand
-- out again ids and attempts numbers the old one had (neither its sequence nor its claims
-- replicated), and a worker still holding "job 1234, attempt 1" from the old primary must not
-- finish or extend the new primary's job 1234 (docs/decisions/017-claims-fenced-by-their-time.md).

-- name: enqueue
-- Insert a chunk of jobs in one round trip through the SQL enqueue (enqueue_many,
-- its file is in fairq.schema.FUNCTION_FILES), the one implementation every client shares: it
-- checks the jobs, creates or wakes their tenants' schedule rows and notifies listeners at
-- commit; returns the ids in input order. Tenants and payloads come one element per job;
-- every other array has one element per job or a single element that every job of the chunk
-- shares (a bulk enqueue), so it is neither sent nor unnested 5,000 times. The arrays go in binary.
-- The payloads go as JSON text, parsed one by one: a cast of the whole text[] to jsonb[]
-- costs several times as much (about 2 us a payload against 0.25). NULL when every payload of
-- the chunk is {}, the default: nothing to send, parse or check.
SELECT {schema}.enqueue_many(
    tasks => %(tasks)b::text[], tenants => %(tenants)b::text[],
    payloads => CASE WHEN %(payloads)b::text[] IS NOT NULL THEN
        ARRAY(SELECT p::jsonb FROM unnest(%(payloads)b::text[]) WITH ORDINALITY AS u(p, o)
              ORDER BY o) END,
    queues => %(queues)b::text[],
    run_ats => %(run_ats)b::timestamptz[], delays => %(delays)b::float8[],
    priorities => %(priorities)b::int[], costs => %(costs)b::float8[],
    max_attempts => %(max_attempts)b::int[], lease_seconds => %(leases)b::int[],
    keys => %(keys)b::text[]
) AS ids;

-- name: finish_done
-- Mark a batch of running jobs done, with their results; give their tenants' slots back.
-- Returns the ids that were still ours (the others lost their lease and are left alone).
-- results and notes: JSON texts and "result not stored" notes (fairq.results), one per job, or
-- NULL arrays when no job of the batch has one (unnest pads them with NULLs).
-- run_seconds: how long each handler ran, measured by the worker (NULL: the database's
-- started_at to now): policy time's charge and each tenant's expected run time.
-- The jobs are locked in id order, as by every statement that writes several of one worker's
-- jobs (the heartbeat's extend_leases may be writing the same ones).
WITH input AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(results)s::text[],
                         %(notes)s::text[], %(run_seconds)s::float8[], %(started)s::timestamptz[])
        AS i(id, attempts, result, note, run_s, started)
    ORDER BY i.id
),
done AS (
    UPDATE {schema}.jobs j
    SET status = 'done', finished_at = now(), locked_until = NULL, result = i.result::jsonb,
        last_error = coalesce(i.note, j.last_error)
    FROM input i
    WHERE j.id = i.id AND j.status = 'running' AND j.attempts = i.attempts
      AND (i.started IS NULL OR j.started_at = i.started)
    -- ran: at least a microsecond, so no tenant's expected run time is 0 (a claim of policy
    -- time divides by it).
    RETURNING j.id, j.queue, j.tenant, j.task, j.started_at, j.finished_at, j.charged_s,
              greatest(1e-6::float8, coalesce(
                  i.run_s, extract(epoch FROM j.finished_at - j.started_at)::float8)) AS ran
),
-- The batch's tenants' slots given back by return_slots (alembic/versions/0001_baseline/
-- slots.sql): each tenant row written by a statement of its own, in (queue, tenant) order as
-- every statement locks them, so no finish waits in a cycle with a claim, an enqueue or
-- another finish. Same in the statements below. Policy time's charges are corrected there
-- (the time run minus the time charged), and each tenant's expected run time moves.
slots AS (
    SELECT {schema}.return_slots(array_agg(p.queue), array_agg(p.tenant), array_agg(p.n),
                                 NULL, NULL, array_agg(p.corr), array_agg(p.n),
                                 array_agg(p.mean)) AS written
    FROM (SELECT d.queue, d.tenant, count(*)::int AS n,
                 coalesce(sum(d.ran - d.charged_s), 0.0) AS corr, avg(d.ran) AS mean
          FROM done d GROUP BY 1, 2) p
)
SELECT d.id, d.queue, d.tenant, d.task,
       extract(epoch FROM d.finished_at - d.started_at)::float8 AS run_seconds
FROM done d, slots;

-- name: finish_failed
-- Record failures: back to queued with exponential backoff (20 s, 40 s, 80 s ... capped at
-- 1 hour) or failed for good after max_attempts. The retry waits in run_at, so it neither
-- blocks its tenant's other jobs nor pre-empts anyone; a given delay is capped at ten years
-- (as an enqueue's), so no retry lands outside jobs_run_at_check. The ids in %(final)s fail
-- for good at once: a retry could only fail the same way (a payload that cannot be decoded).
-- run_seconds: as finish_done's (a failed run used worker time too).
WITH input AS (
    SELECT i.*, i.id = ANY(%(final)s::bigint[]) AS final
    FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(errors)s::text[],
                %(retry_delays)s::float8[], %(run_seconds)s::float8[], %(started)s::timestamptz[])
        AS i(id, attempts, error, retry_delay, run_s, started)
    ORDER BY i.id
),
failed AS (
    UPDATE {schema}.jobs j
    SET status = CASE WHEN j.attempts >= j.max_attempts OR i.final THEN 'failed' ELSE 'queued' END,
        run_at = CASE WHEN j.attempts >= j.max_attempts OR i.final THEN j.run_at
                      ELSE now() + make_interval(secs => least(315360000.0, coalesce(
                          i.retry_delay, least(3600.0, 20.0 * power(2, j.attempts - 1))))) END,
        finished_at = CASE WHEN j.attempts >= j.max_attempts OR i.final THEN now() END,
        last_error = i.error, locked_until = NULL, locked_by = NULL
    FROM input i
    WHERE j.id = i.id AND j.status = 'running' AND j.attempts = i.attempts
      AND (i.started IS NULL OR j.started_at = i.started)
    RETURNING j.id, j.queue, j.tenant, j.task, j.status, j.run_at, j.started_at, j.charged_s,
              greatest(1e-6::float8, coalesce(
                  i.run_s, extract(epoch FROM now() - j.started_at)::float8)) AS ran
),
-- An idle tenant wakes for its earliest retry.
slots AS (
    SELECT {schema}.return_slots(array_agg(p.queue), array_agg(p.tenant), array_agg(p.n),
                                 NULL, array_agg(p.retry_at), array_agg(p.corr),
                                 array_agg(p.n), array_agg(p.mean)) AS written
    FROM (SELECT f.queue, f.tenant, count(*)::int AS n,
                 min(f.run_at) FILTER (WHERE f.status = 'queued') AS retry_at,
                 coalesce(sum(f.ran - f.charged_s), 0.0) AS corr, avg(f.ran) AS mean
          FROM failed f GROUP BY 1, 2) p
)
SELECT f.id, f.queue, f.tenant, f.task, f.status,
       extract(epoch FROM now() - f.started_at)::float8 AS run_seconds
FROM failed f, slots;

-- name: extend_leases
-- Push the leases of our running jobs forward, in id order as the finishes lock them; returns
-- the ids that are still ours.
UPDATE {schema}.jobs j
SET locked_until = now() + make_interval(secs => coalesce(%(seconds)s, j.lease_seconds))
FROM (SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(started)s::timestamptz[])
          AS u(id, attempts, started)
      ORDER BY u.id) i
WHERE j.id = i.id AND j.status = 'running' AND j.attempts = i.attempts
  AND (i.started IS NULL OR j.started_at = i.started)
RETURNING j.id, j.locked_until;

-- name: release_unstarted
-- Hand back jobs a stopping worker claimed but never started: queued again at their old place,
-- the claim's attempt undone, their tenants' slots given back and the tenants runnable again.
-- Fenced like every finish, so a job already reaped and re-claimed elsewhere is left alone.
WITH input AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(started)s::timestamptz[])
        AS i(id, attempts, started)
    ORDER BY i.id
),
released AS (
    UPDATE {schema}.jobs j
    SET status = 'queued', attempts = j.attempts - 1, locked_until = NULL, locked_by = NULL,
        started_at = NULL
    FROM input i
    WHERE j.id = i.id AND j.status = 'running' AND j.attempts = i.attempts
      AND (i.started IS NULL OR j.started_at = i.started)
    RETURNING j.id, j.queue, j.tenant, j.charged_s
),
-- Every released job is due again: its tenant is runnable. It never ran: policy time's charge
-- is taken back.
slots AS (
    SELECT {schema}.return_slots(array_agg(p.queue), array_agg(p.tenant), array_agg(p.n),
                                 array_agg(true), NULL, array_agg(p.corr)) AS written
    FROM (SELECT r.queue, r.tenant, count(*)::int AS n,
                 -coalesce(sum(r.charged_s), 0.0) AS corr
          FROM released r GROUP BY 1, 2) p
)
SELECT r.id FROM released r, slots;

-- name: hand_back_running
-- Hand back jobs a stopping worker was still running when its grace period ended (their
-- handlers may go on running in that process until it exits): queued again at their old place
-- (run_at kept: due at once, no retry backoff), the interrupted attempt undone as
-- release_unstarted's, their tenants' slots given back and the tenants runnable again.
-- last_error says so: 'handed back: ' and the worker's note (%(notes)s, one per job).
-- The bound: a job whose last_error already starts with 'handed back: ' was interrupted by the
-- previous stop too, and nothing has finished or failed it since (every finish, failure and
-- reap writes last_error; a done job keeps it, but is never handed back again). Its attempt
-- is counted this time: queued again with it, or failed for good at max_attempts. So the
-- first interruption in a row is free and the following ones are not: a job that every
-- deploy interrupts fails after max_attempts + 1 stops in a row instead of looping for ever.
-- run_seconds: as finish_done's. Policy time: the job did run, for run_seconds, and its
-- tenant is charged that time (the correction is the time run minus the claim's charge, as a
-- failure's), not given the charge back as release_unstarted does: worker time a tenant used
-- is not free because a deploy cut it short, and its next claim charges the job again. Its
-- expected run time does not move: a run cut short says nothing of how long its jobs take.
-- Fenced like every finish; locked in id order as they are.
WITH input AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(notes)s::text[],
                         %(run_seconds)s::float8[], %(started)s::timestamptz[])
        AS i(id, attempts, note, run_s, started)
    ORDER BY i.id
),
handed AS (
    UPDATE {schema}.jobs j
    SET status = CASE WHEN starts_with(j.last_error, 'handed back: ')
                       AND j.attempts >= j.max_attempts THEN 'failed' ELSE 'queued' END,
        attempts = CASE WHEN starts_with(j.last_error, 'handed back: ') THEN j.attempts
                        ELSE j.attempts - 1 END,
        finished_at = CASE WHEN starts_with(j.last_error, 'handed back: ')
                            AND j.attempts >= j.max_attempts THEN now() END,
        last_error = 'handed back: ' || coalesce(i.note, 'its worker stopped')
                     || CASE WHEN starts_with(j.last_error, 'handed back: ')
                             THEN format('; attempt %%s of %%s counted (stopped twice in a row)',
                                         j.attempts, j.max_attempts)
                             ELSE '' END,
        locked_until = NULL, locked_by = NULL
    FROM input i
    WHERE j.id = i.id AND j.status = 'running' AND j.attempts = i.attempts
      AND (i.started IS NULL OR j.started_at = i.started)
    RETURNING j.id, j.queue, j.tenant, j.status, j.attempts = i.attempts AS counted,
              j.charged_s,
              greatest(1e-6::float8, coalesce(
                  i.run_s, extract(epoch FROM now() - j.started_at)::float8)) AS ran
),
-- A tenant with a job queued again is runnable again.
slots AS (
    SELECT {schema}.return_slots(array_agg(p.queue), array_agg(p.tenant), array_agg(p.n),
                                 array_agg(p.requeued), NULL, array_agg(p.corr)) AS written
    FROM (SELECT h.queue, h.tenant, count(*)::int AS n, bool_or(h.status = 'queued') AS requeued,
                 coalesce(sum(h.ran - h.charged_s), 0.0) AS corr
          FROM handed h GROUP BY 1, 2) p
)
SELECT h.id, h.status, h.counted FROM handed h, slots;

-- name: reap_expired
-- Return running jobs whose lease expired to the queue, or fail them at max_attempts, and
-- give their tenants' slots back. SKIP LOCKED: a worker finishing one of them right now wins.
WITH expired AS MATERIALIZED (
    SELECT q.id FROM {schema}.jobs q
    WHERE q.status = 'running' AND q.locked_until < now()
    ORDER BY q.locked_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
reaped AS (
    UPDATE {schema}.jobs j
    SET status = CASE WHEN j.attempts >= j.max_attempts THEN 'failed' ELSE 'queued' END,
        run_at = CASE WHEN j.attempts >= j.max_attempts THEN j.run_at ELSE now() END,
        finished_at = CASE WHEN j.attempts >= j.max_attempts THEN now() END,
        last_error = format('lease expired during attempt %%s of %%s (worker %%s)',
                            j.attempts, j.max_attempts, coalesce(j.locked_by, '?')),
        locked_until = NULL, locked_by = NULL
    FROM expired e WHERE j.id = e.id
    RETURNING j.id, j.queue, j.tenant, j.status
),
-- A tenant with a job queued again is runnable again.
slots AS (
    SELECT {schema}.return_slots(array_agg(p.queue), array_agg(p.tenant), array_agg(p.n),
                                 array_agg(p.requeued), NULL) AS written
    FROM (SELECT r.queue, r.tenant, count(*)::int AS n, bool_or(r.status = 'queued') AS requeued
          FROM reaped r GROUP BY 1, 2) p
)
SELECT r.id, r.queue, r.tenant, r.status FROM reaped r, slots;

-- name: cancel
-- queued -> cancelled; a running job is left to finish.
UPDATE {schema}.jobs SET status = 'cancelled', finished_at = now()
WHERE id = %(id)s AND status = 'queued'
RETURNING id;

-- name: get_job
SELECT id, queue, tenant, task, payload, status, priority, cost, run_at, attempts, max_attempts,
       lease_seconds, locked_until, locked_by, last_error, created_at, started_at, finished_at,
       result
FROM {schema}.jobs WHERE id = %(id)s;

-- name: prune_finished
-- Delete one batch of finished jobs older than max_age seconds; call until it returns 0 (its
-- row count is the jobs deleted). Their trace contexts (job_traces, fairq.otel) go with them,
-- and each batch sweeps the next `limit` contexts, in job id order from where the last sweep
-- stopped (the settings row maintenance:trace_sweep), for rows whose job went another way (a
-- DELETE of the user's, the previous release's pruner). With no traced job this reads two
-- empty index ranges and writes nothing more.
WITH old AS (
    SELECT id FROM {schema}.jobs
    WHERE status IN ('done', 'failed', 'cancelled')
      AND finished_at < now() - make_interval(secs => %(max_age)s)
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
-- Probes of the primary keys (= ANY of an array), never a scan of job_traces or of jobs.
traces AS (
    DELETE FROM {schema}.job_traces t WHERE t.job_id = ANY(ARRAY(SELECT o.id FROM old o))
),
mark AS (
    SELECT coalesce((SELECT (s.value->>'after')::bigint FROM {schema}.settings s
                     WHERE s.key = 'maintenance:trace_sweep'), 0) AS after
),
scanned AS MATERIALIZED (
    SELECT t.job_id FROM {schema}.job_traces t
    WHERE t.job_id > (SELECT m.after FROM mark m)
    ORDER BY t.job_id LIMIT %(limit)s
),
-- A job and its context are written in one transaction, so this statement's snapshot sees
-- both or neither: a context whose job it cannot see has lost its job for good. (The jobs
-- `old` deletes are still seen here: `traces` takes their contexts.)
live AS MATERIALIZED (
    SELECT j.id FROM {schema}.jobs j WHERE j.id = ANY(ARRAY(SELECT s.job_id FROM scanned s))
),
orphans AS (
    DELETE FROM {schema}.job_traces t
    WHERE t.job_id = ANY(ARRAY(SELECT s.job_id FROM scanned s EXCEPT SELECT l.id FROM live l))
),
swept AS (
    -- The next sweep starts after the last context read, or from the front again once a
    -- sweep reached the end; written only when there was something to sweep.
    INSERT INTO {schema}.settings AS st (key, value)
    SELECT 'maintenance:trace_sweep',
           jsonb_build_object('after', CASE WHEN count(*) < %(limit)s THEN 0
                                            ELSE max(s.job_id) END)
    FROM scanned s
    HAVING count(*) > 0 OR (SELECT m.after FROM mark m) > 0
    ON CONFLICT (key) DO UPDATE SET value = excluded.value
)
DELETE FROM {schema}.jobs j USING old WHERE j.id = old.id;

-- name: runnable_count
-- Is anything runnable now in these queues (for --until-empty)?
SELECT count(*) AS n FROM (
    SELECT 1 FROM {schema}.jobs
    WHERE queue = ANY(%(queues)s) AND status = 'queued' AND run_at <= now() LIMIT 1) s;
