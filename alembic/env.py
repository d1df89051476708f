"""Alembic environment for fairq's own migrations.

Works programmatically (``fairq.migrate.upgrade``) and from the ``alembic`` command
(``alembic -x schema=fairq -x dsn=postgresql://... upgrade head``). fairq's version table lives
inside fairq's schema, so it never collides with the application's own Alembic history, and a
transaction-level advisory lock makes concurrent ``migrate`` calls from many processes safe.
"""

from __future__ import annotations

import os

from sqlalchemy import create_engine, pool, text

from alembic import context
from fairq.schema import DEFAULT_SCHEMA, validate_schema_name

config = context.config
xargs = context.get_x_argument(as_dictionary=True)
schema = validate_schema_name(
    config.attributes.get("schema")
    or xargs.get("schema")
    or os.environ.get("FAIRQ_SCHEMA")
    or DEFAULT_SCHEMA
)
# No SQLAlchemy metadata: the engine's truth is SQL (fairq/sql/engine/), and
# scripts/draft-migration drafts a migration from the catalog's difference, not autogenerate.
target_metadata = None
VERSION_TABLE = "alembic_version"


def _url() -> str:
    from fairq.config import sqlalchemy_url

    dsn = config.attributes.get("dsn") or xargs.get("dsn") or config.get_main_option("sqlalchemy.url")
    return sqlalchemy_url(dsn or None)


def run_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        version_table=VERSION_TABLE,
        version_table_schema=schema,
        include_schemas=False,
    )
    with context.begin_transaction():
        context.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is None:
        engine = create_engine(_url(), poolclass=pool.NullPool)
        with engine.connect() as conn:
            _migrate(conn)
        engine.dispose()
    else:
        _migrate(connection)


def _migrate(conn: object) -> None:
    context.configure(
        connection=conn,  # type: ignore[arg-type]
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        version_table_schema=schema,
        include_schemas=False,
        transaction_per_migration=False,
    )
    with context.begin_transaction():
        # One migrator per schema at a time; the others wait here and then find nothing to do.
        context.execute(text("SELECT pg_advisory_xact_lock(hashtext(:k))").bindparams(
            k=f"fairq.migrate.{schema}"))
        context.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
