"""The named-statement loader: what is sent is the statement without its comments (pure, no DB)."""

from __future__ import annotations

import pytest
from psycopg import _queries

from fairq import sql
from fairq.sql import _compact

# psycopg parses a query's placeholders once and caches the result only for texts up to this
# many bytes; a longer statement is parsed again on every execute (in Python, per claim).
PSYCOPG_CACHE_LIMIT = getattr(_queries, "MAX_CACHED_STATEMENT_LENGTH", 4096)
# Statements rendered with other placeholders than {schema} (roles: {role}, ...) are not
# executed per job; the test renders the ones that take the schema alone.
LONG_SCHEMA = "s" * 40


def test_compact_drops_comments_indentation_and_blank_lines() -> None:
    body = (
        "-- leading comment\n"
        "WITH a AS (\n"
        "    SELECT 1 AS x   -- trailing comment\n"
        "\n"
        "        FROM t  WHERE  y = 2\n"
        ")\n"
        "SELECT x FROM a"
    )
    assert _compact("demo", body) == (
        "-- fairq demo\nWITH a AS (\nSELECT 1 AS x\nFROM t WHERE y = 2\n)\nSELECT x FROM a"
    )


def test_compact_keeps_quoted_text_whole() -> None:
    body = "SELECT 'a -- b', 'it''s  two', \"odd--name\"  -- gone\nFROM t"
    assert _compact("q", body) == "-- fairq q\nSELECT 'a -- b', 'it''s  two', \"odd--name\"\nFROM t"


@pytest.mark.parametrize("body", ["SELECT 'open\nliteral'", "SELECT 'unterminated",
                                  "SELECT $$a -- b$$"])
def test_compact_refuses_literals_it_could_change(body: str) -> None:
    with pytest.raises(RuntimeError, match="'bad'"):
        _compact("bad", body)


def test_every_statement_is_labelled_and_has_no_comment() -> None:
    for name in sql.names():
        text = sql._raw()[name]
        first, _, rest = text.partition("\n")
        assert first == f"-- fairq {name}"
        assert "--" not in rest.replace("'--'", ""), name


@pytest.mark.parametrize("schema", ["fairq", LONG_SCHEMA])
def test_statements_fit_psycopgs_query_cache(schema: str) -> None:
    """The fair claim statements were 4.5-5.2 KB with their comments: over psycopg's limit, so
    every claim re-parsed its text (cProfile: 0.15 ms of Python per claim at one tenant)."""
    too_long = {}
    for name in sql.names():
        try:
            text = sql.statement(name, schema)
        except KeyError:  # another placeholder besides {schema}: not a per-job statement
            continue
        size = len(text.encode())
        if size > PSYCOPG_CACHE_LIMIT:
            too_long[name] = size
    # claim_fair writes its weights out (a plpgsql call per tenant cost more database CPU than
    # psycopg's re-parse, ~0.08 ms per claim here, costs Python): it fits with the default
    # schema, and a long schema name pays the re-parse.
    if schema == LONG_SCHEMA:
        too_long.pop("claim_fair", None)
    assert too_long == {}
