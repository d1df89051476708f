-- Settings of fairq's own sessions. On a direct connection the same settings are given once
-- at connect time (libpq options, see fairq.store.planner.planner_options).

-- name: label_session
-- Behind a pooler this lands on whichever server connection serves it: it only labels.
SELECT set_config('application_name', %(name)s, false);

-- name: transaction_settings
-- Behind a transaction-mode pooler session state does not stick to a server connection, so
-- every transaction sets the timeouts, planner settings and search path for itself (SET LOCAL
-- semantics; fairq/store/planner.py, SEARCH_PATH says why).
SELECT set_config('search_path', 'pg_catalog, pg_temp', true),
       set_config('statement_timeout', %(statement_timeout)s, true),
       set_config('lock_timeout', %(lock_timeout)s, true),
       -- NULL keeps the server's or role's own setting (it may be remote_apply).
       set_config('synchronous_commit',
                  coalesce(%(synchronous_commit)s, current_setting('synchronous_commit')), true),
       set_config('plan_cache_mode', %(plan_cache_mode)s, true),
       set_config('enable_seqscan', %(enable_seqscan)s, true),
       set_config('enable_hashjoin', %(enable_hashjoin)s, true),
       set_config('enable_mergejoin', %(enable_mergejoin)s, true),
       set_config('enable_bitmapscan', %(enable_bitmapscan)s, true),
       set_config('enable_sort', %(enable_sort)s, true),
       set_config('jit', %(jit)s, true);
