"""The only layer that talks to PostgreSQL. ``pg``: the sync ``Store``, one method per operation,
on the sessions of ``sessions`` (the pool, the timeouts, the cursor). Its other parts: ``aio``
(asyncio), ``ops`` (operators' actions), ``monitor`` (the monitoring reads), ``workers`` (the
worker registry's writes), ``listen`` (the LISTEN session), ``enqueue`` (what the sync and async
enqueues share), ``caller_connection`` (writing in the caller's transaction), ``planner`` (the
planner settings), ``loaders`` (the type loaders) and ``errors`` (the driver's error types)."""

from fairq.store.caller_connection import connection_for
from fairq.store.pg import Store

__all__ = ["Store", "connection_for"]
