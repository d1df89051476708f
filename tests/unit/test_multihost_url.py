"""Multi-host libpq URLs (a primary and its standbys, ``target_session_attrs=read-write``) reach
every connection fairq makes: psycopg takes them as they are; ``fairq.config.sqlalchemy_url``
(the migrations' engine, and the URL callers give their own SQLAlchemy engines) used to turn
``postgresql://h1:5432,h2:5433/db`` into a URL SQLAlchemy reads ``5432,h2:5433`` as the port of.
"""

from __future__ import annotations

import pytest
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.engine import make_url

from fairq.config import redact, sqlalchemy_url
from fairq.errors import InvalidInput


def connect_args(dsn: str) -> dict[str, object]:
    """What SQLAlchemy's psycopg dialect hands psycopg.connect for ``sqlalchemy_url(dsn)``."""
    args, kwargs = PGDialect_psycopg().create_connect_args(make_url(sqlalchemy_url(dsn)))
    assert args == []
    return dict(kwargs)


MULTI = "postgresql://app:s%40cret@db1:5432,db2:5433/jobs?target_session_attrs=read-write"


def test_multi_host_url_keeps_every_host_port_and_the_session_attrs() -> None:
    got = connect_args(MULTI)
    assert got["host"] == "db1,db2"
    assert got["port"] == "5432,5433"
    assert got["target_session_attrs"] == "read-write"
    assert got["dbname"] == "jobs"
    assert got["user"] == "app"
    assert got["password"] == "s@cret"


@pytest.mark.parametrize("prefix", ["postgresql://", "postgres://", "postgresql+psycopg://"])
def test_every_scheme_with_several_hosts(prefix: str) -> None:
    got = connect_args(prefix + "u@h1:1,h2:2,h3:3/d?target_session_attrs=read-write")
    assert (got["host"], got["port"], got["dbname"]) == ("h1,h2,h3", "1,2,3", "d")


def test_hosts_without_ports_and_ipv6() -> None:
    got = connect_args("postgresql://u@h1,h2:6432/d")
    assert (got["host"], got["port"]) == ("h1,h2", ",6432")  # h1 on the default port
    got = connect_args("postgresql://u@[::1]:5432,[::1]:5433/d")
    assert (got["host"], got["port"]) == ("::1,::1", "5432,5433")


def test_key_value_dsn_with_several_hosts() -> None:
    got = connect_args("host=h1,h2 port=5432,5433 dbname=d user=u "
                       "target_session_attrs=read-write")
    assert (got["host"], got["port"], got["target_session_attrs"]) == (
        "h1,h2", "5432,5433", "read-write")


def test_single_host_urls_are_unchanged() -> None:
    assert sqlalchemy_url("postgresql://u:p@h:5432/d?sslmode=require") == \
        "postgresql+psycopg://u:p@h:5432/d?sslmode=require"
    assert sqlalchemy_url("postgres://u@h/d") == "postgresql+psycopg://u@h/d"
    assert sqlalchemy_url(None) == "postgresql+psycopg://"


def test_a_comma_after_the_host_part_is_not_several_hosts() -> None:
    url = "postgresql://u@h/d?options=-c%20a%3D1,b"
    assert sqlalchemy_url(url) == "postgresql+psycopg://u@h/d?options=-c%20a%3D1,b"


@pytest.mark.parametrize("url", ["postgresql://u:hunter2@[::1:1,h2/d",
                                 "postgresql://u:hunter2@h1,h2/d?bogus=1"])
def test_unparsable_multi_host_url_is_one_line_without_the_password(url: str) -> None:
    with pytest.raises(InvalidInput) as err:
        sqlalchemy_url(url)
    assert "hunter2" not in str(err.value)
    assert "\n" not in str(err.value)


def test_redact_masks_the_password_of_a_multi_host_url() -> None:
    assert redact(MULTI) == (
        "postgresql://app:***@db1:5432,db2:5433/jobs?target_session_attrs=read-write")
