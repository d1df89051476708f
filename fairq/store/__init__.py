"""The only layer that talks to PostgreSQL: one method per operation (see ``store.pg``); its
other parts are ``aio`` (asyncio), ``ops`` (operators' actions), ``monitor`` (the monitoring
reads), ``listen`` (the LISTEN session) and ``errors`` (the driver's error types)."""

from fairq.store.pg import Store, connection_for

__all__ = ["Store", "connection_for"]
