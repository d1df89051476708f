-- Settings of fairq's own sessions. On a direct connection the same settings are given once
-- at connect time (libpq options, see fairq.store.pg.planner_options).

-- name: label_session
-- Behind a pooler this lands on whichever server connection serves it: it only labels.
SELECT set_config('application_name', %(name)s, false);

-- name: transaction_settings
-- Behind a transaction-mode pooler session state does not stick to a server connection, so
-- every transaction sets the timeouts and planner settings for itself (SET LOCAL semantics).
SELECT set_config('statement_timeout', %(statement_timeout)s, true),
       set_config('lock_timeout', %(lock_timeout)s, true),
       -- NULL keeps the server's or role's own setting (it may be remote_apply).
       set_config('synchronous_commit',
                  coalesce(%(synchronous_commit)s, current_setting('synchronous_commit')), true),
       set_config('plan_cache_mode', %(plan_cache_mode)s, true),
       set_config('enable_seqscan', %(enable_seqscan)s, true),
       set_config('enable_hashjoin', %(enable_hashjoin)s, true),
       set_config('enable_mergejoin', %(enable_mergejoin)s, true),
       set_config('enable_bitmapscan', %(enable_bitmapscan)s, true),
       set_config('jit', %(jit)s, true);

-- name: warm_allocator
-- Once per new connection: one large allocation, freed at once. glibc raises its mmap and trim
-- thresholds in a process to the size of the largest mmapped block it freed (up to 32 MiB on
-- 64-bit, mallopt(3)), so afterwards the server process keeps the memory a statement frees for
-- the next one. Without it, a process whose thresholds were never raised hands the fair claims'
-- executor memory (about 1 MB once a waited-for row is rechecked) back to the kernel after every
-- statement and faults it in again on the next: 9,000-12,000 page faults per 1,000 jobs at one
-- busy tenant, fifo 210. Harmless elsewhere: another allocator, or a server process behind a
-- pooler that another connection warmed already. Its cost is the server writing the bytes once
-- (4 MiB: 25 ms on the project's machine).
SELECT length(repeat('x', %(bytes)s)) AS n;
