"""Creating and dropping the throwaway databases the tests run in."""

from __future__ import annotations

import secrets

import psycopg
from psycopg import sql

SCHEMA = "fairq"


def dsn_for_db(admin_dsn: str, dbname: str) -> str:
    """The admin DSN pointed at another database."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(admin_dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)  # type: ignore[arg-type]


def create_database(admin_dsn: str, prefix: str, template: str | None = None) -> str:
    name = f"{prefix}_{secrets.token_hex(6)}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        if template:
            conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)))
        else:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return name


def drop_database(admin_dsn: str, name: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
