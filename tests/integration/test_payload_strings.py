"""Payloads and results checked on their decoded strings: a NUL character is refused wherever it
is (keys and values, at any depth), the text backslash-u0000 is not a NUL and is stored as is
(as the SQL enqueue does), and keys that two Python keys both become as JSON text (1 and "1")
are refused instead of one being silently lost."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import fairq
from fairq.cli import main
from fairq.results import encode_result
from fairq.validation import payload

LITERAL = {"path": "C:\\u0000dir"}  # a backslash, then the five characters u0000


@pytest.fixture
def app(dsn: str) -> Iterator[fairq.App]:
    a = fairq.App(dsn, schema="fairq")
    yield a
    a.close()


def stored_payloads(dsn: str) -> list[Any]:
    with psycopg.connect(dsn) as c:
        return [r[0] for r in c.execute("SELECT payload FROM fairq.jobs ORDER BY id")]


@pytest.mark.parametrize("value", [
    LITERAL, {"C:\\u0000dir": 1}, ["\\u0000"], {"a": [{"b": "x\\u0000y"}]}, "\\u0000",
    {"s": "\\\\u0000"},
])
def test_the_text_backslash_u0000_is_no_nul(app: fairq.App, dsn: str, value: Any) -> None:
    app.enqueue("t", tenant="a", payload=value)
    app.enqueue_many("t", [("b", value)])
    assert stored_payloads(dsn) == [value, value]


@pytest.mark.parametrize("value", [
    {"path": "C:\x00dir"}, {"C:\x00": 1}, [["a", {"b": "\x00"}]], "\x00", {"k": {"\x00": None}},
])
def test_a_nul_anywhere_is_refused(app: fairq.App, dsn: str, value: Any) -> None:
    with pytest.raises(fairq.InvalidInput, match="must not contain NUL characters"):
        app.enqueue("t", tenant="a", payload=value)
    with pytest.raises(fairq.InvalidInput, match="must not contain NUL characters"):
        app.enqueue_many("t", [("a", {}), ("b", value)])
    assert stored_payloads(dsn) == []


def test_cli_accepts_the_text_backslash_u0000(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    text = json.dumps(LITERAL)
    assert main(["--dsn", dsn, "enqueue", "t", "--no-app", "--tenant", "a",
                 "--payload", text]) == 0
    assert stored_payloads(dsn) == [LITERAL]
    assert main(["--dsn", dsn, "enqueue", "t", "--no-app", "--tenant", "a",
                 "--payload", '{"path": "C:\\u0000dir"}']) == 2  # a real NUL, once decoded
    assert "NUL" in capsys.readouterr().err


@pytest.mark.parametrize("value", [
    {1: "a", "1": "b"}, {"true": 1, True: 2}, {None: 1, "null": 2}, {1.5: "x", "1.5": "y"},
    [{"x": {2: "a", "2": "b"}}],
])
def test_keys_that_collide_as_json_text_are_refused(app: fairq.App, dsn: str,
                                                    value: Any) -> None:
    with pytest.raises(fairq.InvalidInput, match=r"two keys that are both .* as JSON text"):
        app.enqueue("t", tenant="a", payload=value)
    with pytest.raises(fairq.InvalidInput, match="as JSON text"):
        app.enqueue_many("t", [("a", {}), ("b", value)])
    assert stored_payloads(dsn) == []


@pytest.mark.parametrize(("value", "stored"), [
    ({1: "a", 2: "b"}, {"1": "a", "2": "b"}),
    ({None: 1, "x": 2, 3: [True]}, {"null": 1, "x": 2, "3": [True]}),
    ({"b": 1, "a": {"d": 2, "c": 3}}, {"a": {"c": 3, "d": 2}, "b": 1}),
])
def test_keys_that_do_not_collide_are_kept(app: fairq.App, dsn: str, value: Any,
                                           stored: Any) -> None:
    app.enqueue("t", tenant="a", payload=value)
    assert stored_payloads(dsn) == [stored]


def test_unserialisable_values_still_say_so() -> None:
    with pytest.raises(fairq.InvalidInput, match="not JSON-serialisable"):
        payload({"a": object()})
    with pytest.raises(fairq.InvalidInput, match="not JSON-serialisable"):
        payload({1: object(), "x": 1})


def test_results_follow_the_same_rules() -> None:
    assert encode_result(LITERAL) == (json.dumps(LITERAL, separators=(",", ":")), None)
    text, note = encode_result({"a": "x\x00"})
    assert text is None and note is not None and "NUL" in note
    text, note = encode_result({1: "a", "1": "b"})
    assert text is None and note is not None and "as JSON text" in note
    assert encode_result({1: "a", "x": None})[0] == '{"1":"a","x":null}'
    text, note = encode_result({"a": object()})
    assert text is None and note is not None and "not JSON-serialisable" in note


def test_a_result_with_the_text_backslash_u0000_is_stored(app: fairq.App) -> None:
    @app.task(name="t", lease=30)
    def t(job: fairq.Job) -> Any:
        return job.payload

    job_id = app.enqueue("t", tenant="a", payload=LITERAL)
    dup = app.enqueue("t", tenant="a", payload={"k": 1})

    @app.task(name="d", lease=30)
    def d(job: fairq.Job) -> Any:
        return {1: "a", "1": "b"}

    lost = app.enqueue("d", tenant="a")
    app.worker(concurrency=2, listen=False, poll_interval=0.2).run(until_empty=True)
    info = app.job(job_id)
    assert info is not None and info.status == "done" and info.result == LITERAL
    assert info.last_error is None
    assert app.job(dup) is not None
    shown = app.job(lost)
    assert shown is not None and shown.status == "done" and shown.result is None
    assert shown.last_error is not None and "as JSON text" in shown.last_error
