"""The claims are sent in positional form: psycopg does not parse their text, whatever its length.

psycopg caches its parsing of a query's %(name)s placeholders only for texts up to 4 KiB, and
parses a longer one again, in the worker's Python, on every execution (0.09 ms for the 4.4 KiB
fair claim statement of migrations up to 0018; claim_fair is now a short call of a function).
The store sends every claim in positional form, so no claim is parsed, however long it grows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from psycopg import _queries

from fairq import migrate, sql
from fairq.models import NewJob
from fairq.policies import POLICIES, get_policy
from fairq.store import Store

LONG_SCHEMA = "fairq_" + "x" * 34  # 40 characters


@pytest.fixture
def long_store(dsn: str) -> Iterator[Store]:
    migrate.upgrade(dsn, LONG_SCHEMA)
    store = Store(dsn, LONG_SCHEMA, max_size=2)
    store.pool.wait()
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The texts psycopg parses without its cache (the function it calls for a long text)."""
    seen: list[bytes] = []
    real = _queries._query2pg_nocache

    def spy(query: bytes, encoding: str) -> Any:
        seen.append(query)
        return real(query, encoding)

    monkeypatch.setattr(_queries, "_query2pg_nocache", spy)
    return seen


def test_a_claim_is_not_parsed_by_psycopg_with_a_long_schema_name(
    long_store: Store, parses: list[bytes]
) -> None:
    # The control: a claim statement over 4 KiB (claim_fifo and a long comment) in %(name)s form,
    # through a plain cursor, is parsed (for a queue that does not exist: it changes nothing).
    params = get_policy("fifo").claim_params(queue="nowhere", batch=1, worker="control")
    with long_store.pool.connection() as conn:
        conn.execute(sql.statement("claim_fifo", LONG_SCHEMA) + "\n-- " + "x" * 4096, params)
    assert len(parses) == 1
    parses.clear()

    long_store.enqueue([NewJob("t", f"tenant{i % 3}", "{}") for i in range(2 * len(POLICIES))])
    claimed = []
    for name in sorted(POLICIES):
        for _ in range(2):
            claimed += long_store.claim(get_policy(name), queue="default", batch=1, worker="w")
    assert len({job.id for job in claimed}) == 2 * len(POLICIES)
    assert parses == []
