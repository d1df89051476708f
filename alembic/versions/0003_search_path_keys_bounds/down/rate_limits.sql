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

-- A tenant's tokens now, on the database clock; NULL when it has no rate limit.
CREATE OR REPLACE FUNCTION {schema}.tenant_tokens(s {schema}.tenant_schedule) RETURNS float8
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN s.rate IS NOT NULL THEN least(s.burst::float8, coalesce(
        s.tokens + s.rate * extract(epoch FROM now() - s.refilled_at)::float8, s.burst)) END
$$;

-- How many jobs a claim may take from a tenant: its free slots, and with a rate limit at most
-- its whole tokens (the 1e-9 absorbs the rounding of a wake-up timed to the token).
CREATE OR REPLACE FUNCTION {schema}.claim_room(s {schema}.tenant_schedule) RETURNS int
LANGUAGE sql STABLE AS $$
    SELECT least(s.max_running - s.running, floor({schema}.tenant_tokens(s) + 1e-9)::int)
$$;

-- A rate-limited tenant without a whole token: it must leave the runnable set.
CREATE OR REPLACE FUNCTION {schema}.tenant_dry(s {schema}.tenant_schedule) RETURNS bool
LANGUAGE sql STABLE AS $$
    SELECT coalesce({schema}.tenant_tokens(s) + 1e-9 < 1, false)
$$;

-- When a dry tenant's next token is due (now when it is not dry).
CREATE OR REPLACE FUNCTION {schema}.token_due(s {schema}.tenant_schedule) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN {schema}.tenant_dry(s)
        THEN now() + make_interval(secs => (1 - {schema}.tenant_tokens(s)) / s.rate)
        ELSE now() END
$$;

-- When the tenant's bucket holds (or held) its next whole token: NULL without a rate limit or
-- with a full bucket.
CREATE OR REPLACE FUNCTION {schema}.token_at(s {schema}.tenant_schedule) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN s.rate IS NOT NULL AND s.tokens IS NOT NULL AND s.refilled_at IS NOT NULL
        THEN s.refilled_at + make_interval(secs => greatest(0.0, 1 - s.tokens) / s.rate) END
$$;

-- The seconds of the open throttled interval so far: from throttled_since to the next token
-- (token_at), or to now while it has none; 0 when no interval is open.
CREATE OR REPLACE FUNCTION {schema}.throttled_open(s {schema}.tenant_schedule) RETURNS float8
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN s.throttled_since IS NULL OR {schema}.token_at(s) IS NULL THEN 0.0
        ELSE greatest(0.0, extract(epoch FROM least(now(), {schema}.token_at(s))
                                               - s.throttled_since)::float8) END
$$;

-- The tenant's time spent throttled up to now (the exporter's counter, `fairq stats`): the
-- credited seconds and the open interval.
CREATE OR REPLACE FUNCTION {schema}.throttled_total(s {schema}.tenant_schedule) RETURNS float8
LANGUAGE sql STABLE AS $$
    SELECT s.throttled_seconds + {schema}.throttled_open(s)
$$;
