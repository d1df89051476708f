-- Enqueue in SQL: the one implementation of enqueueing, for every client. Python's
-- App.enqueue / enqueue_many call enqueue_many; any other language calls
--     SELECT {schema}.enqueue(task => 'send_report', tenant => 'acme', payload => '{"report": 7}');
-- inside its own transaction. {schema} is the quoted schema name, {channel} the NOTIFY channel
-- of the schema as a literal.
--
-- SECURITY DEFINER, with a fixed search_path: the producer role gets EXECUTE on these two and
-- nothing on the tables (docs/roles.md), so it can enqueue but can neither write a schedule
-- row's virtual time nor pick a tenant's weight. EXECUTE is revoked from PUBLIC below.
--
-- Bad input raises SQLSTATE FQ001 (fairq's own code: class FQ, "invalid input") with a one-line
-- message naming the argument, before anything is written.

-- Enqueue many jobs in one call; returns their ids in input order. `tenants` and `payloads`
-- have one element per job; every other array has one element per job or a single element
-- that every job shares (NULL: the default); every array is one-dimensional, subscripted from
-- 1. `delays` are seconds added to the database clock, for jobs without a run_at; a run_at is
-- between 1970-01-01 and 9999-01-01 UTC (jobs_run_at_check). A job whose `keys` element is set
-- is not inserted while a job of the same tenant with the same task and key is queued or
-- running: that job's id is returned instead (keys are per tenant: jobs_key_idx).
CREATE OR REPLACE FUNCTION {schema}.enqueue_many(
    tasks text[], tenants text[], payloads jsonb[] DEFAULT NULL, queues text[] DEFAULT NULL,
    run_ats timestamptz[] DEFAULT NULL, delays float8[] DEFAULT NULL,
    priorities int[] DEFAULT NULL, costs float8[] DEFAULT NULL,
    max_attempts int[] DEFAULT NULL, lease_seconds int[] DEFAULT NULL, keys text[] DEFAULT NULL
) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    n int := coalesce(cardinality(tenants), 0);
    problem text;
    out_ids bigint[];
    new_ids bigint[];
    keyed bool := EXISTS (SELECT FROM unnest(keys) k WHERE k IS NOT NULL);
    todo bool[];
    attempt int := 0;
    w_queues text[];
    w_tenants text[];
    w_runs timestamptz[];
    wake_v float8;
    wake_q text;
    fast bool;
    fast_queue text;
    fast_task text;
    fast_priority int;
    fast_cost float8;
    fast_attempts int;
    fast_lease int;
    fast_run timestamptz;
    t_queues text[];
    t_tenants text[];
    t_runs timestamptz[];
    m_tenants text[];
    covered int;
    s_queues text[];
    s_tenants text[];
    s_runs timestamptz[];
    o_queues text[];
    o_tenants text[];
    o_runs timestamptz[];
    rounds int;
BEGIN
    IF n = 0 THEN
        RETURN '{}';
    END IF;
    -- Every check in one statement (one round through the executor, not one per check): the
    -- first that fails gives the message. coalesce evaluates its arguments in order and stops
    -- at the first that is not null.
    SELECT coalesce(
        -- Every array one-dimensional from subscript 1: the code below reads tasks[1] and
        -- unnests them side by side, which a 2-D array or other bounds would silently defeat.
        (SELECT a.name || CASE WHEN a.dims > 1
                    THEN ' must be a one-dimensional array, not ' || a.dims || '-dimensional'
                    ELSE ' must be subscripted from 1, not from ' || a.lo END
         FROM (VALUES
             ('tasks', array_ndims(tasks), array_lower(tasks, 1)),
             ('tenants', array_ndims(tenants), array_lower(tenants, 1)),
             ('payloads', array_ndims(payloads), array_lower(payloads, 1)),
             ('queues', array_ndims(queues), array_lower(queues, 1)),
             ('run_ats', array_ndims(run_ats), array_lower(run_ats, 1)),
             ('delays', array_ndims(delays), array_lower(delays, 1)),
             ('priorities', array_ndims(priorities), array_lower(priorities, 1)),
             ('costs', array_ndims(costs), array_lower(costs, 1)),
             ('max_attempts', array_ndims(enqueue_many.max_attempts),
              array_lower(enqueue_many.max_attempts, 1)),
             ('lease_seconds', array_ndims(enqueue_many.lease_seconds),
              array_lower(enqueue_many.lease_seconds, 1)),
             ('keys', array_ndims(keys), array_lower(keys, 1))
         ) AS a(name, dims, lo) WHERE a.dims > 1 OR a.lo <> 1 LIMIT 1),
        -- Every array: NULL, one element (shared) or one per job.
        (SELECT a.name || ' must have 1 element or one per tenant (' || n || ')'
         FROM (VALUES
             ('tasks', cardinality(tasks)), ('payloads', cardinality(payloads)),
             ('queues', cardinality(queues)), ('run_ats', cardinality(run_ats)),
             ('delays', cardinality(delays)), ('priorities', cardinality(priorities)),
             ('costs', cardinality(costs)),
             ('max_attempts', cardinality(enqueue_many.max_attempts)),
             ('lease_seconds', cardinality(enqueue_many.lease_seconds)),
             ('keys', cardinality(keys))
         ) AS a(name, len) WHERE a.len IS NOT NULL AND a.len NOT IN (1, n) LIMIT 1),
        CASE WHEN tasks IS NULL THEN 'task must not be null' END,
        -- Names: 1 to 200 characters (text cannot hold NUL).
        (SELECT c.kind || ' must be 1 to 200 characters, not '
                || coalesce(quote_literal(left(c.v, 40)) || CASE WHEN length(c.v) > 40
                            THEN '... (' || length(c.v) || ' characters)' ELSE '' END, 'null')
         FROM (SELECT 'tenant' AS kind, t AS v FROM unnest(tenants) t
               UNION ALL SELECT 'task', t FROM unnest(tasks) t
               UNION ALL SELECT 'queue', q FROM unnest(queues) q WHERE q IS NOT NULL
               UNION ALL SELECT 'key', k FROM unnest(keys) k WHERE k IS NOT NULL) c
         WHERE c.v IS NULL OR length(c.v) NOT BETWEEN 1 AND 200
         LIMIT 1),
        -- Numbers, the same ranges as fairq/validation.py.
        (SELECT 'priority must be between -32768 and 32767, not ' || p
         FROM unnest(priorities) p WHERE p NOT BETWEEN -32768 AND 32767 LIMIT 1),
        (SELECT 'cost must be > 0 and <= 1e9, not ' || c
         FROM unnest(costs) c WHERE NOT (c > 0 AND c <= 1e9) LIMIT 1),
        (SELECT 'max_attempts must be between 1 and 1000, not ' || m
         FROM unnest(enqueue_many.max_attempts) m WHERE m NOT BETWEEN 1 AND 1000 LIMIT 1),
        (SELECT 'lease_seconds must be between 1 and 86400, not ' || l
         FROM unnest(enqueue_many.lease_seconds) l WHERE l NOT BETWEEN 1 AND 86400 LIMIT 1),
        (SELECT 'delay must be between 0 and 315360000 seconds, not ' || d
         FROM unnest(delays) d WHERE NOT (d >= 0 AND d <= 315360000) LIMIT 1),
        -- The range every client shares (fairq.validation): times a client can decode.
        (SELECT 'run_at must be between 1970-01-01 and 9999-01-01 UTC'
         FROM unnest(run_ats) r
         WHERE NOT (r >= '1970-01-01 00:00:00+00' AND r < '9999-01-01 00:00:00+00') LIMIT 1),
        (SELECT 'give run_at or delay, not both'
         WHERE EXISTS (SELECT FROM unnest(run_ats) r WHERE r IS NOT NULL)
           AND EXISTS (SELECT FROM unnest(delays) d WHERE d IS NOT NULL)),
        -- Payloads: at most 1,048,576 bytes of compact JSON text (no space after `,` and `:`,
        -- as Python's client writes it; jsonb::text adds those spaces, taken out again only for
        -- the rare payload near the limit) and 100 levels of arrays and objects (a container
        -- at level 100 below the top is the 101st). Fewer than 200 bytes of text cannot nest
        -- 101 levels, so short payloads skip the path query. OFFSET 0 keeps the subquery
        -- whole: flattened, each mention of its size would convert the payload to text again.
        (SELECT 'payload' || CASE WHEN n = 1 THEN '' ELSE ' ' || p.ord END || ' is ' || CASE
                    WHEN c.size > 1048576 THEN c.size || ' bytes as JSON text; the limit is 1048576'
                    ELSE 'nested more than 100 levels deep; the limit is 100 levels of arrays '
                         'and objects'
                END
         FROM (SELECT x.ord, octet_length(x.p::text) AS size, x.p
               FROM unnest(payloads) WITH ORDINALITY AS x(p, ord) WHERE x.p IS NOT NULL
               OFFSET 0) p
         CROSS JOIN LATERAL (
             SELECT CASE WHEN p.size <= 1048576 THEN p.size
                         ELSE octet_length(regexp_replace(
                             p.p::text, '("(?:[^"\\]|\\.)*")|([:,]) ', '\1\2', 'g')) END AS size
         ) c
         WHERE c.size > 1048576
            OR (p.size > 200 AND jsonb_path_exists(
                    p.p, 'strict $.**{100} ? (@.type() == "array" || @.type() == "object")'))
         ORDER BY p.ord LIMIT 1))
    INTO problem;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'FQ001', MESSAGE = 'fairq: ' || problem;
    END IF;

    -- The shape App.enqueue_many sends: no key, and every column but tenants and payloads
    -- shared (NULL or one element). Its jobs are inserted from those two arrays alone, with
    -- the shared values as constants: no per-row CASE over eleven arrays, no work table of the
    -- input, and the tenants to touch are its distinct tenants, all with the same first run.
    fast := NOT keyed AND coalesce(cardinality(tasks), 0) <= 1
        AND coalesce(cardinality(queues), 0) <= 1 AND coalesce(cardinality(run_ats), 0) <= 1
        AND coalesce(cardinality(delays), 0) <= 1 AND coalesce(cardinality(priorities), 0) <= 1
        AND coalesce(cardinality(costs), 0) <= 1
        AND coalesce(cardinality(enqueue_many.max_attempts), 0) <= 1
        AND coalesce(cardinality(enqueue_many.lease_seconds), 0) <= 1;

    -- Insert in rounds: a keyed job that lost the race to a job that has finished since it
    -- was seen is tried again (bounded: each round needs another producer's job to finish).
    LOOP
        attempt := attempt + 1;
        IF fast THEN
            -- The shared values as scalars: a generic plan (fairq's sessions force them) would
            -- subscript and coalesce each array once a row.
            fast_queue := coalesce(queues[1], 'default');
            fast_priority := coalesce(priorities[1], 0);
            fast_cost := coalesce(costs[1], 1);
            fast_attempts := coalesce(enqueue_many.max_attempts[1], 5);
            fast_lease := coalesce(enqueue_many.lease_seconds[1], 300);
            -- A delay is added to the database clock, never to the producer's.
            fast_run := coalesce(run_ats[1], now() + make_interval(secs => coalesce(delays[1], 0)));
            fast_task := tasks[1];
            WITH ins AS (
                INSERT INTO {schema}.jobs AS j (queue, tenant, task, payload, priority, cost,
                                                run_at, max_attempts, lease_seconds)
                SELECT fast_queue, i.tenant, fast_task, coalesce(i.payload, '{}'), fast_priority,
                       fast_cost, fast_run, fast_attempts, fast_lease
                FROM unnest(tenants, payloads) WITH ORDINALITY AS i(tenant, payload, ord)
                ORDER BY i.ord
                RETURNING j.id
            )
            SELECT array_agg(ins.id ORDER BY ins.id) INTO new_ids FROM ins;
            SELECT array_agg(fast_queue), array_agg(t.tenant ORDER BY t.tenant), array_agg(fast_run)
            INTO t_queues, t_tenants, t_runs
            FROM (SELECT DISTINCT u.tenant FROM unnest(tenants) AS u(tenant)) t;
        ELSE
            WITH input AS (
                SELECT i.ord, i.tenant, coalesce(i.payload, '{}') AS payload,
                       CASE WHEN cardinality(tasks) = 1 THEN tasks[1] ELSE i.task END AS task,
                       coalesce(CASE WHEN cardinality(queues) = 1 THEN queues[1] ELSE i.queue END,
                                'default') AS queue,
                       coalesce(CASE WHEN cardinality(priorities) = 1 THEN priorities[1]
                                     ELSE i.priority END, 0) AS priority,
                       coalesce(CASE WHEN cardinality(costs) = 1 THEN costs[1] ELSE i.cost END, 1)
                           AS cost,
                       CASE WHEN cardinality(run_ats) = 1 THEN run_ats[1] ELSE i.run_at END
                           AS run_at,
                       CASE WHEN cardinality(delays) = 1 THEN delays[1] ELSE i.delay END AS delay,
                       coalesce(CASE WHEN cardinality(enqueue_many.max_attempts) = 1
                                     THEN enqueue_many.max_attempts[1] ELSE i.max_attempts END, 5)
                           AS max_attempts,
                       coalesce(CASE WHEN cardinality(enqueue_many.lease_seconds) = 1
                                     THEN enqueue_many.lease_seconds[1]
                                     ELSE i.lease_seconds END, 300) AS lease_seconds,
                       CASE WHEN cardinality(keys) = 1 THEN keys[1] ELSE i.key END AS key
                FROM unnest(tenants, payloads, tasks, queues, priorities, costs, run_ats, delays,
                            enqueue_many.max_attempts, enqueue_many.lease_seconds, keys)
                    WITH ORDINALITY AS i(tenant, payload, task, queue, priority, cost, run_at,
                                         delay, max_attempts, lease_seconds, key, ord)
                WHERE todo IS NULL OR todo[i.ord]
            ),
            -- Jobs without a key are inserted without ON CONFLICT: a speculative insertion costs
            -- every row a lock and a WAL record more, for nothing.
            plain AS (
                INSERT INTO {schema}.jobs AS j (queue, tenant, task, payload, priority, cost,
                                                run_at, max_attempts, lease_seconds)
                -- A delay is added to the database clock, never to the producer's.
                SELECT i.queue, i.tenant, i.task, i.payload, i.priority, i.cost,
                       coalesce(i.run_at, now() + make_interval(secs => coalesce(i.delay, 0))),
                       i.max_attempts, i.lease_seconds
                FROM input i WHERE i.key IS NULL ORDER BY i.ord
                RETURNING j.id, j.queue, j.tenant, j.run_at
            ),
            with_key AS (
                INSERT INTO {schema}.jobs AS j (queue, tenant, task, payload, priority, cost,
                                                run_at, max_attempts, lease_seconds, key)
                SELECT i.queue, i.tenant, i.task, i.payload, i.priority, i.cost,
                       coalesce(i.run_at, now() + make_interval(secs => coalesce(i.delay, 0))),
                       i.max_attempts, i.lease_seconds, i.key
                FROM input i WHERE i.key IS NOT NULL ORDER BY i.ord
                ON CONFLICT (task, tenant, key)
                    WHERE key IS NOT NULL AND status IN ('queued', 'running')
                DO NOTHING
                RETURNING j.id, j.queue, j.tenant, j.run_at
            ),
            per_tenant AS (
                SELECT ins.queue, ins.tenant, min(ins.run_at) AS first_run
                FROM (SELECT * FROM plain UNION ALL SELECT * FROM with_key) ins GROUP BY 1, 2
            )
            -- The jobs without a key got their ids in input order (only keyed ones can be
            -- skipped).
            SELECT (SELECT array_agg(plain.id ORDER BY plain.id) FROM plain),
                   array_agg(p.queue ORDER BY p.queue, p.tenant),
                   array_agg(p.tenant ORDER BY p.queue, p.tenant),
                   array_agg(p.first_run ORDER BY p.queue, p.tenant)
            INTO new_ids, t_queues, t_tenants, t_runs
            FROM per_tenant p;
        END IF;
        -- The tenants whose (queue, tenant) has no schedule row yet: this transaction creates
        -- their rows, from their settings, so it takes their settings locks first, shared, in a
        -- statement of its own (settings.sql, decision 020): the statement below then reads the
        -- settings with a snapshot taken after any change that held the lock committed, and a
        -- change that comes later waits for this commit and then finds the rows. A scalar
        -- subquery per pair: a probe by key.
        SELECT array_agg(DISTINCT p.tenant)
        INTO m_tenants
        FROM unnest(t_queues, t_tenants) AS p(queue, tenant)
        WHERE (SELECT true FROM {schema}.tenant_schedule o
               WHERE o.queue = p.queue AND o.tenant = p.tenant) IS NULL;
        IF m_tenants IS NOT NULL THEN
            PERFORM {schema}.lock_settings(m_tenants, false);
        END IF;
        -- The tenants of the jobs just inserted, one row each (t_queues, t_tenants, t_runs: in
        -- (queue, tenant) order, with their first job's run_at). A new tenant starts at the
        -- queue's virtual time V (queue_vtime); an idle one that wakes, at V plus what it still
        -- owes of its last job (vtime.sql): idle time banks no credit, recent service keeps its
        -- debt. Existing tenants' rows are held FOR KEY SHARE until this transaction commits:
        -- a claim retires a tenant only under FOR UPDATE, which conflicts, so it cannot retire
        -- one whose new job it cannot see yet; KEY SHARE does not conflict with the claims' and
        -- finishes' FOR NO KEY UPDATE (docs/algorithm.md).
        WITH per_tenant AS (
            SELECT p.queue, p.tenant, p.first_run
            FROM unnest(t_queues, t_tenants, t_runs) AS p(queue, tenant, first_run)
        ),
        defaults AS (
            SELECT (s.value->>'weight')::float8 AS weight, (s.value->>'max_running')::int AS max_running,
                   (s.value->>'rate')::float8 AS rate, (s.value->>'burst')::int AS burst
            FROM {schema}.settings s WHERE s.key = 'tenant_defaults'
        ),
        new_tenants AS (
            INSERT INTO {schema}.tenant_schedule AS ts (queue, tenant, weight, max_running, vtime,
                                                       active, wake_at, rate, burst, tenant_group)
            SELECT p.queue, p.tenant, coalesce(t.weight, d.weight, 1.0),
                   coalesce(t.max_running, d.max_running, 10),
                   {schema}.queue_vtime(p.queue), p.first_run <= now(),
                   CASE WHEN p.first_run > now() THEN p.first_run END,
                   CASE WHEN t.tenant IS NOT NULL THEN t.rate ELSE d.rate END,
                   CASE WHEN t.tenant IS NOT NULL THEN t.burst ELSE d.burst END, t.tenant_group
            FROM per_tenant p
            LEFT JOIN {schema}.tenants t ON t.tenant = p.tenant
            LEFT JOIN defaults d ON true
            -- Only tenants without a row: a conflict check on a row a claim or finish has just
            -- rewritten (every such update adds a primary key entry) waits for its commit. A
            -- scalar subquery, a probe by key per tenant: NOT EXISTS becomes an anti join that,
            -- planned generic with sorts off, reads the table's whole key.
            -- (Only the locked tenants: one whose row went after the look above is in no
            -- row here, and the repair below locks it first.)
            WHERE p.tenant = ANY(m_tenants)
              AND (SELECT true FROM {schema}.tenant_schedule o
                   WHERE o.queue = p.queue AND o.tenant = p.tenant) IS NULL
            ORDER BY p.queue, p.tenant
            ON CONFLICT (queue, tenant) DO NOTHING
            RETURNING ts.queue
        ),
        -- The tenants locked in (queue, tenant) order, each by its key: the order is sorted
        -- from the chunk's few tenants, never read from tenant_schedule's primary key, which
        -- the planner reads whole in order when the session plans with sorts off, as fairq's
        -- sessions do.
        seen AS MATERIALIZED (
            SELECT x.queue, x.tenant, x.active, x.wake_at
            FROM (SELECT p.queue, p.tenant FROM per_tenant p ORDER BY p.queue, p.tenant) p
            CROSS JOIN LATERAL (
                SELECT ts.queue, ts.tenant, ts.active, ts.wake_at
                FROM {schema}.tenant_schedule ts
                WHERE ts.queue = p.queue AND ts.tenant = p.tenant
                FOR KEY SHARE OF ts) x
        ),
        notified AS (
            SELECT count(pg_notify({channel}, q.queue)) AS sent
            FROM (SELECT DISTINCT p.queue FROM per_tenant p WHERE p.first_run <= now()) q
        )
        -- The idle tenants to wake, in (queue, tenant) order (those that stay idle only when
        -- their new first job is earlier than their wake-up).
        SELECT w.queues, w.tenants, w.runs, t.touched + (SELECT count(*) FROM seen)
        INTO w_queues, w_tenants, w_runs, covered
        FROM notified, (SELECT count(*) AS touched FROM new_tenants) t,
             (SELECT array_agg(s.queue ORDER BY s.queue, s.tenant) AS queues,
                     array_agg(s.tenant ORDER BY s.queue, s.tenant) AS tenants,
                     array_agg(p.first_run ORDER BY s.queue, s.tenant) AS runs
              FROM seen s JOIN per_tenant p USING (queue, tenant)
              WHERE NOT s.active
                AND (p.first_run <= now() OR s.wake_at IS NULL OR p.first_run < s.wake_at)) w;
        -- Every pair has its row, held by this transaction (KEY SHARE, or created by it), but
        -- when one went between the look above and the lock (a `tenants delete`, the schedule
        -- vacuum) or another producer created it meanwhile: then lock what is there again with
        -- a fresh snapshot, and create what is missing under its tenants' settings locks, until
        -- nothing is missing. Without this a job could stay queued with no row, which no
        -- claim ever finds.
        rounds := 0;
        WHILE covered < cardinality(t_tenants) LOOP
            rounds := rounds + 1;
            IF rounds > 10 THEN
                RAISE EXCEPTION 'fairq: the schedule rows of these tenants kept going; try again'
                    USING ERRCODE = '40001';
            END IF;
            WITH per_tenant AS (
                SELECT p.queue, p.tenant, p.first_run
                FROM unnest(t_queues, t_tenants, t_runs) AS p(queue, tenant, first_run)
            ),
            held AS MATERIALIZED (
                SELECT p.queue, p.tenant, p.first_run, x.active, x.wake_at, x.queue IS NOT NULL AS found
                FROM (SELECT * FROM per_tenant p ORDER BY p.queue, p.tenant) p
                LEFT JOIN LATERAL (
                    SELECT ts.queue, ts.active, ts.wake_at
                    FROM {schema}.tenant_schedule ts
                    WHERE ts.queue = p.queue AND ts.tenant = p.tenant
                    FOR KEY SHARE OF ts) x ON true
            )
            SELECT (SELECT count(*)::int FROM held h WHERE h.found),
                   array_agg(h.queue ORDER BY h.queue, h.tenant) FILTER (WHERE NOT h.found),
                   array_agg(h.tenant ORDER BY h.queue, h.tenant) FILTER (WHERE NOT h.found),
                   array_agg(h.first_run ORDER BY h.queue, h.tenant) FILTER (WHERE NOT h.found),
                   array_agg(h.queue ORDER BY h.queue, h.tenant) FILTER (WHERE h.found
                       AND NOT h.active AND (h.first_run <= now() OR h.wake_at IS NULL
                                             OR h.first_run < h.wake_at)),
                   array_agg(h.tenant ORDER BY h.queue, h.tenant) FILTER (WHERE h.found
                       AND NOT h.active AND (h.first_run <= now() OR h.wake_at IS NULL
                                             OR h.first_run < h.wake_at)),
                   array_agg(h.first_run ORDER BY h.queue, h.tenant) FILTER (WHERE h.found
                       AND NOT h.active AND (h.first_run <= now() OR h.wake_at IS NULL
                                             OR h.first_run < h.wake_at))
            INTO covered, o_queues, o_tenants, o_runs, s_queues, s_tenants, s_runs
            FROM held h;
            IF o_tenants IS NOT NULL THEN
                PERFORM {schema}.lock_settings(o_tenants, false);
                PERFORM {schema}.ensure_schedule(o_queues, o_tenants, o_runs);
            END IF;
        END LOOP;
        IF rounds > 0 THEN
            -- The idle tenants to wake are those the last look found, in (queue, tenant) order.
            w_queues := s_queues;
            w_tenants := s_tenants;
            w_runs := s_runs;
        END IF;
        -- Only idle tenants are written (a busy tenant's row is left to the claimers), each by
        -- a statement of its own, in (queue, tenant) order as every statement locks them, with
        -- a snapshot taken after the lock above: an UPDATE in the locking statement would
        -- reach a row it holds through the older version its snapshot sees, and wait there
        -- behind a claim or finish queued on that version for this transaction (a deadlock).
        FOR i IN 1 .. coalesce(cardinality(w_tenants), 0) LOOP
            -- V once per queue, before the first of its tenants wakes (as a claim's sleepers).
            IF w_runs[i] <= now() AND (wake_q IS NULL OR wake_q <> w_queues[i]) THEN
                wake_v := {schema}.queue_vtime(w_queues[i]);
                wake_q := w_queues[i];
            END IF;
            UPDATE {schema}.tenant_schedule ts
            SET active = w_runs[i] <= now(),
                -- vtime.sql: back at V, keeping up to one job's worth of the debt it left with.
                vtime = CASE WHEN w_runs[i] <= now()
                             THEN greatest(wake_v, least(ts.vtime, wake_v + greatest(1.0, 1.0 / ts.weight)))
                             ELSE ts.vtime END,
                wake_at = CASE WHEN w_runs[i] <= now() THEN NULL
                               ELSE least(ts.wake_at, w_runs[i]) END
            WHERE ts.queue = w_queues[i] AND ts.tenant = w_tenants[i] AND NOT ts.active
              AND (w_runs[i] <= now() OR ts.wake_at IS NULL OR w_runs[i] < ts.wake_at);
        END LOOP;
        IF NOT keyed THEN
            RETURN new_ids;
        END IF;
        -- Each job: its id from an earlier round, else (no key) the next of new_ids, else (a
        -- key) the live job of its tenant with its task and key, inserted by this round or not. A fresh
        -- snapshot: it sees the concurrent producer's job that made ours conflict, once that
        -- committed. No joins between the inputs: index probes and array subscripts only.
        SELECT array_agg(CASE WHEN r.id IS NOT NULL THEN r.id
                              WHEN r.key IS NULL THEN new_ids[r.k]
                              ELSE (SELECT j.id FROM {schema}.jobs j
                                    WHERE j.task = r.task AND j.tenant = r.tenant
                                      AND j.key = r.key
                                      AND j.status IN ('queued', 'running')) END
                         ORDER BY r.ord)
        INTO out_ids
        FROM (SELECT g.ord, g.id, g.task, g.tenant, g.key,
                     count(*) FILTER (WHERE g.key IS NULL AND g.id IS NULL)
                         OVER (ORDER BY g.ord) AS k
              FROM (SELECT s.ord, out_ids[s.ord] AS id,
                           CASE WHEN cardinality(tasks) = 1 THEN tasks[1] ELSE tasks[s.ord] END
                               AS task, tenants[s.ord] AS tenant,
                           CASE WHEN cardinality(keys) = 1 THEN keys[1] ELSE keys[s.ord] END AS key
                    FROM generate_series(1, n) AS s(ord)) g) r;
        todo := (SELECT array_agg(x IS NULL ORDER BY o) FROM unnest(out_ids) WITH ORDINALITY AS u(x, o));
        IF NOT (true = ANY(todo)) THEN
            RETURN out_ids;
        END IF;
        IF attempt >= 10 THEN
            RAISE EXCEPTION 'fairq: a job of the same tenant with the same task and key kept finishing; try again'
                USING ERRCODE = '40001';
        END IF;
    END LOOP;
END
$$;

-- Enqueue one job; returns its id (or, with a key, the id of the tenant's live job with this
-- task and key). The defaults are App.enqueue's for a task it does not know.
CREATE OR REPLACE FUNCTION {schema}.enqueue(
    task text, tenant text, payload jsonb DEFAULT '{}', queue text DEFAULT 'default',
    run_at timestamptz DEFAULT NULL, priority int DEFAULT 0, cost float8 DEFAULT 1,
    max_attempts int DEFAULT 5, lease_seconds int DEFAULT 300, key text DEFAULT NULL
) RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT ({schema}.enqueue_many(
        tasks => ARRAY[task], tenants => ARRAY[tenant], payloads => ARRAY[payload],
        queues => ARRAY[coalesce(queue, 'default')], run_ats => ARRAY[run_at],
        priorities => ARRAY[coalesce(priority, 0)], costs => ARRAY[coalesce(cost, 1)],
        max_attempts => ARRAY[coalesce(max_attempts, 5)],
        lease_seconds => ARRAY[coalesce(lease_seconds, 300)], keys => ARRAY[key]))[1]
$$;

REVOKE EXECUTE ON FUNCTION {schema}.enqueue_many(text[], text[], jsonb[], text[], timestamptz[],
    float8[], int[], float8[], int[], int[], text[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {schema}.enqueue(text, text, jsonb, text, timestamptz, int, float8,
    int, int, text) FROM PUBLIC;
