"""The only layer that talks to PostgreSQL: one method per operation (see ``store.pg``)."""

from fairq.store.pg import Store, connection_for

__all__ = ["Store", "connection_for"]
