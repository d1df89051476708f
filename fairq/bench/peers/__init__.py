"""Peer-queue benchmark harness: PgQueuer and Procrastinate on the same PostgreSQL."""
