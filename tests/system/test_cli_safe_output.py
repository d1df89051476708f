"""A producer's names cannot drive an operator's terminal: ``fairq jobs``, ``fairq tenants
list``, ``explain`` and the errors print ESC sequences, carriage returns, newlines and
bidirectional overrides escaped, in the tables and in JSON (still valid JSON); an oversized
value is not echoed whole in an error; a cron field of 100,000 digits is one InvalidInput."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import fairq
from fairq.cli.safe_text import SafeStream, shown
from fairq.runtime.periodic import cron

EVIL = "evil\x1b[2J\x1b]0;pwned\x07\rdone\nfake-row\u202eabc\x9b31m"


def _cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fairq", "--dsn", dsn, *args],
                          capture_output=True, text=True, timeout=120)


def _inert(text: str) -> None:
    for bad in ("\x1b", "\x07", "\r", "\u202e", "\x9b"):
        assert bad not in text, repr(text)


def test_names_are_escaped_in_tables_lines_and_json(dsn: str) -> None:
    with fairq.App(dsn) as app:
        app.enqueue("t", tenant=EVIL, payload={"note": "a\x1bb"})
        app.tenants.set(EVIL, weight=2.0)
    for args in (["jobs"], ["tenants", "list"], ["tenants", "explain", EVIL],
                 ["tenants", "set", EVIL, "--weight", "3"]):
        proc = _cli(dsn, *args)
        assert proc.returncode == 0, proc.stderr
        _inert(proc.stdout + proc.stderr)
        assert "fake-row" not in [line.strip() for line in proc.stdout.splitlines()]
        assert "\\x1b[2J" in proc.stdout and "\\n" in proc.stdout, proc.stdout
    listed = _cli(dsn, "tenants", "list", "--json")
    _inert(listed.stdout)
    assert EVIL in [t["tenant"] for t in json.loads(listed.stdout)]  # the exact name, decoded


def test_an_error_line_is_escaped_and_cut(dsn: str) -> None:
    proc = _cli(dsn, "tenants", "set", EVIL, "--weight", "0")
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    _inert(proc.stderr)


def test_an_oversized_error_is_cut(capsys: pytest.CaptureFixture[str]) -> None:
    """Validation names a long value by its length; any error line past 500 characters (a
    driver's message quoting a value, say) is cut all the same, saying how long it was."""
    import argparse

    from fairq.cli._common import report_error

    code = report_error(argparse.Namespace(command="enqueue"),
                        fairq.InvalidInput("bad payload " + "x\x1b" * 50_000))
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and len(err) < 700
    assert "characters in all)" in err and "\x1b" not in err, err[:200]


def test_the_stream_keeps_lines_and_escapes_the_rest() -> None:
    import io

    buf = io.StringIO()
    SafeStream(buf).write("a\tb\nc\x1b[31md\x00\n")
    assert buf.getvalue() == "a\tb\nc\\x1b[31md\\x00\n"
    assert shown("x\ny\u2066z") == "x\\ny\\u2066z" and shown("naïve 日本 🙂") == "naïve 日本 🙂"


def test_a_cron_of_100000_digits_is_invalid_input() -> None:
    with pytest.raises(fairq.InvalidInput, match="100,008 characters"):
        cron("1" * 100_000 + " * * * *")
    with pytest.raises(fairq.InvalidInput, match="invalid cron"):
        cron("9" * 150 + " * * * *")
