-- Rate limits: a token bucket per (queue, tenant), and the time a tenant spends throttled.
-- {schema} is the quoted schema name.
--
-- A rate-limited tenant (tenant_schedule.rate, jobs per second, and burst, the bucket's size)
-- holds `tokens` as of `refilled_at`; the bucket refills at `rate` up to `burst` (docs/
-- algorithm.md, "Rate limits"). NULL tokens or refilled_at mean a full bucket. A tenant whose
-- bucket holds no whole token leaves the runnable set until its next token is due (wake_at),
-- and the claim's sleeper wake-up brings it back: no claim walks it, nothing polls for it.
--
-- tenant_schedule.throttled_seconds counts the seconds a rate-limited tenant had a due job
-- and no whole token; throttled_since opens the current such interval (docs/algorithm.md,
-- "Time spent throttled"). An interval opens when a claim retires the tenant dry while it has
-- a queued job, at now or at that job's run_at if later; it is credited, up to the moment the
-- bucket held its next token (token_at) and never past now, when a claim serves the tenant,
-- retires it for another reason, or `tenants set/apply` settles its bucket (fairq/sql/
-- tenants.sql, ops.sql). token_at is read from the bucket (tokens as of refilled_at), so a
-- tenant woken early (an enqueue, a retry, a reap) or late (no claim at its wake_at) is
-- credited exactly the time it had no token.
--
-- These are sql functions that PostgreSQL inlines into the statement calling them (the claim's
-- walk reads claim_room on every tenant it visits): a SET clause would stop that, so they set
-- no search_path. Their bodies name nothing through it instead: operators as
-- OPERATOR(pg_catalog.op) on operands of one type, functions and casts qualified, fairq's own
-- functions by schema (the callers' search_path, whatever it holds, resolves nothing here).
-- OPERATOR() has one precedence for every operator: the parentheses are needed.

-- A tenant's tokens now, on the database clock; NULL when it has no rate limit.
CREATE OR REPLACE FUNCTION {schema}.tenant_tokens(s {schema}.tenant_schedule) RETURNS float8
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN s.rate IS NOT NULL THEN LEAST(s.burst::pg_catalog.float8, COALESCE(
        s.tokens OPERATOR(pg_catalog.+) (s.rate OPERATOR(pg_catalog.*) EXTRACT(
            epoch FROM pg_catalog.now() OPERATOR(pg_catalog.-) s.refilled_at)::pg_catalog.float8),
        s.burst::pg_catalog.float8)) END
$$;

-- How many jobs a claim may take from a tenant: its free slots, and with a rate limit at most
-- its whole tokens (the 1e-9 absorbs the rounding of a wake-up timed to the token).
CREATE OR REPLACE FUNCTION {schema}.claim_room(s {schema}.tenant_schedule) RETURNS int
LANGUAGE sql STABLE AS $$
    SELECT LEAST(s.max_running OPERATOR(pg_catalog.-) s.running, pg_catalog.floor(
        {schema}.tenant_tokens(s) OPERATOR(pg_catalog.+) 1e-9::pg_catalog.float8)::pg_catalog.int4)
$$;

-- A rate-limited tenant without a whole token: it must leave the runnable set.
CREATE OR REPLACE FUNCTION {schema}.tenant_dry(s {schema}.tenant_schedule) RETURNS bool
LANGUAGE sql STABLE AS $$
    SELECT COALESCE(({schema}.tenant_tokens(s) OPERATOR(pg_catalog.+) 1e-9::pg_catalog.float8)
                    OPERATOR(pg_catalog.<) 1::pg_catalog.float8, false)
$$;

-- When a dry tenant's next token is due (now when it is not dry).
CREATE OR REPLACE FUNCTION {schema}.token_due(s {schema}.tenant_schedule) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN {schema}.tenant_dry(s)
        THEN pg_catalog.now() OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs =>
            (1::pg_catalog.float8 OPERATOR(pg_catalog.-) {schema}.tenant_tokens(s))
            OPERATOR(pg_catalog./) s.rate)
        ELSE pg_catalog.now() END
$$;

-- When the tenant's bucket holds (or held) its next whole token: NULL without a rate limit or
-- with a full bucket.
CREATE OR REPLACE FUNCTION {schema}.token_at(s {schema}.tenant_schedule) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN s.rate IS NOT NULL AND s.tokens IS NOT NULL AND s.refilled_at IS NOT NULL
        THEN s.refilled_at OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs =>
            GREATEST(0::pg_catalog.float8, 1::pg_catalog.float8 OPERATOR(pg_catalog.-) s.tokens)
            OPERATOR(pg_catalog./) s.rate) END
$$;

-- The seconds of the open throttled interval so far: from throttled_since to the next token
-- (token_at), or to now while it has none; 0 when no interval is open.
CREATE OR REPLACE FUNCTION {schema}.throttled_open(s {schema}.tenant_schedule) RETURNS float8
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN s.throttled_since IS NULL OR {schema}.token_at(s) IS NULL
        THEN 0::pg_catalog.float8
        ELSE GREATEST(0::pg_catalog.float8, EXTRACT(epoch FROM
            LEAST(pg_catalog.now(), {schema}.token_at(s)) OPERATOR(pg_catalog.-) s.throttled_since
        )::pg_catalog.float8) END
$$;

-- The tenant's time spent throttled up to now (the exporter's counter, `fairq stats`): the
-- credited seconds and the open interval.
CREATE OR REPLACE FUNCTION {schema}.throttled_total(s {schema}.tenant_schedule) RETURNS float8
LANGUAGE sql STABLE AS $$
    SELECT s.throttled_seconds OPERATOR(pg_catalog.+) {schema}.throttled_open(s)
$$;
