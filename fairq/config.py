"""Where fairq's database is: explicit DSN, ``FAIRQ_DATABASE_URL``, or the embedded server."""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit, urlunsplit

from fairq.errors import InvalidInput
from fairq.names import DEFAULT_SCHEMA, validate_schema_name

ENV_URL = "FAIRQ_DATABASE_URL"
ENV_SCHEMA = "FAIRQ_SCHEMA"


def resolve_dsn(dsn: str | None = None) -> str:
    """Return the libpq DSN to use: ``dsn``, else ``$FAIRQ_DATABASE_URL``, else the embedded server."""
    if dsn:
        return dsn
    env = os.environ.get(ENV_URL, "").strip()
    if env:
        return env
    from fairq import embedded

    return embedded.ensure_server()


def resolve_schema(schema: str | None = None) -> str:
    """Return the validated schema name: ``schema``, else ``$FAIRQ_SCHEMA``, else ``fairq``."""
    if schema is not None:  # an explicit empty name is an error, not "the default"
        return validate_schema_name(schema)
    return validate_schema_name(os.environ.get(ENV_SCHEMA) or DEFAULT_SCHEMA)


def sqlalchemy_url(dsn: str | None) -> str:
    """Turn a libpq URL or key=value DSN into SQLAlchemy's psycopg 3 form
    (``postgresql+psycopg://``).

    A URL naming several hosts (``postgresql://h1:5432,h2:5432/db?target_session_attrs=
    read-write``, a primary and its standbys) is not a URL SQLAlchemy parses (it reads
    ``5432,h2:5432`` as the port): it goes, like a key=value DSN, as libpq fields in the query
    (``host=h1,h2&port=5432,5432``), which SQLAlchemy's psycopg dialect hands to libpq, so
    libpq picks the host as it does for every other connection fairq makes."""
    if not dsn:
        return "postgresql+psycopg://"
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if dsn.startswith(prefix):
            rest = dsn[len(prefix):]
            if not _several_hosts(rest):
                return "postgresql+psycopg://" + rest
            return _query_form("postgresql://" + rest, dsn)
    if "=" in dsn:  # key=value DSN: hand it to psycopg untouched
        return _query_form(dsn, dsn)
    raise InvalidInput(f"not a PostgreSQL URL or DSN: {redact(dsn)}")


def _several_hosts(url_rest: str) -> bool:
    """Whether the authority of a URL (what follows ``scheme://``) lists several hosts."""
    authority = re.split(r"[/?#]", url_rest, maxsplit=1)[0]
    return "," in authority.rsplit("@", 1)[-1]


def _query_form(conninfo: str, given: str) -> str:
    """``conninfo``'s libpq fields as the query of a host-less SQLAlchemy URL."""
    from urllib.parse import quote

    try:
        fields = dsn_fields(conninfo)
    except Exception as e:  # libpq's parser refused it: one line, without the password
        raise InvalidInput(f"not a PostgreSQL URL or DSN: {redact(given)}") from e
    return "postgresql+psycopg:///?" + "&".join(
        f"{k}={quote(v, safe='')}" for k, v in fields.items())


def dsn_fields(dsn: str) -> dict[str, str]:
    """The fields of a libpq connection string (key=value or URL), parsed by libpq's rules."""
    from psycopg.conninfo import conninfo_to_dict

    return {k: str(v) for k, v in conninfo_to_dict(dsn).items() if v is not None}


_URL_USERINFO = re.compile(r"(://[^:/?#@]*:)[^@]*@")
_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]+)", re.IGNORECASE)


def redact(dsn: str) -> str:
    """The DSN with any password replaced by ``***``: safe for logs, errors and metrics."""
    if "://" in dsn:
        try:
            parts = urlsplit(dsn)
        except ValueError:  # malformed (an unclosed IPv6 bracket...): mask by pattern instead
            masked = _URL_USERINFO.sub(r"\1***@", dsn)
            return re.sub(r"(password=)[^&\s]*", r"\1***", masked, flags=re.IGNORECASE)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            if ":" in userinfo:
                userinfo = userinfo.split(":", 1)[0] + ":***"
            netloc = f"{userinfo}@{host}"
        query = re.sub(r"(password=)[^&]*", r"\1***", parts.query, flags=re.IGNORECASE)
        # A "password=" outside the query (garbage such as ":// password=x") is masked too.
        return _URL_PASSWORD.sub(r"\1***", urlunsplit((parts.scheme, netloc, parts.path, query,
                                                       parts.fragment)))
    return _KV_PASSWORD.sub(r"\1***", dsn)
