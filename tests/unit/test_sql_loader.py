"""The named-statement loader: what is sent is the statement without its comments (pure, no DB)."""

from __future__ import annotations

import pytest
from psycopg import _queries

from fairq import sql
from fairq.policies import POLICIES
from fairq.sql import _compact

# psycopg parses a query's placeholders once and caches the result only for texts up to this
# many bytes; a longer statement is parsed again on every execute (in Python, per claim).
PSYCOPG_CACHE_LIMIT = getattr(_queries, "MAX_CACHED_STATEMENT_LENGTH", 4096)
# Statements rendered with other placeholders than {schema} (roles: {role}, ...) are not
# executed per job; the test renders the ones that take the schema alone.
LONG_SCHEMA = "s" * 40
# Executed by the store in positional form (Store._claim_rows): their length does not matter.
CLAIMS = {policy.statement for policy in POLICIES.values()}
# Sent in positional form on a raw cursor too (fairq/store/monitor.py, read_waits).
POSITIONAL = CLAIMS | {"tenant_waits"}


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
    every claim re-parsed its text (cProfile: 0.15 ms of Python per claim at one tenant). The
    claims are sent in positional form (the store's RawCursor), which psycopg does not parse;
    every other statement must fit."""
    too_long = {}
    for name in sql.names():
        if name in POSITIONAL:
            continue
        try:
            text = sql.statement(name, schema)
        except KeyError:  # another placeholder besides {schema}: not a per-job statement
            continue
        size = len(text.encode())
        if size > PSYCOPG_CACHE_LIMIT:
            too_long[name] = size
    assert too_long == {}


def test_positional_form_numbers_each_name_once_by_first_appearance() -> None:
    stmt = sql.to_positional("SELECT %(b)s, %(a)s, %(b)s, 5 %% 2, '%%'")
    assert stmt.text == "SELECT $1, $2, $1, 5 % 2, '%'"
    assert stmt.names == ("b", "a")
    assert stmt.values({"a": 1, "b": 2, "unused": 3}) == [2, 1]


@pytest.mark.parametrize("text", ["SELECT %(a)b", "SELECT %(a)t", "SELECT %s", "SELECT 5 % 2",
                                  "SELECT %", "SELECT $1, %(a)s"])
def test_positional_form_refuses_what_a_raw_cursor_cannot_send_the_same(text: str) -> None:
    with pytest.raises(ValueError):
        sql.to_positional(text)


@pytest.mark.parametrize("schema", ["fairq", LONG_SCHEMA])
@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_positional_form_is_what_psycopg_sends(name: str, schema: str) -> None:
    """The same text and parameter order as psycopg's own conversion of the %(name)s text: the
    server sees one statement (one prepared statement, one pg_stat_statements entry)."""
    text = sql.statement(name, schema)
    sent, _formats, order, _parts = _queries._query2pg(text.encode(), "utf-8")
    stmt = sql.positional(name, schema)
    assert (stmt.text, stmt.names) == (sent.decode(), tuple(order))
