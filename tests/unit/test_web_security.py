"""The console's guards without a server: the bind refusals, the token's constant-time check,
sessions and their CSRF tokens, the Host allowlist, the login's redirect target, and the
``fairq web`` command's one-line refusals (exit 2) before anything starts."""

from __future__ import annotations

import contextlib
import importlib.util
import io
from typing import Any

import pytest

from fairq.cli import main
from fairq.errors import InvalidInput
from fairq.web import security as sec
from fairq.web.server import _safe_next

TOKEN = "a-long-enough-token-1234"


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_loopback_binds_need_no_token(host: str) -> None:
    assert sec.is_loopback(host)
    sec.check_bind(host, None, allow_actions=False)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "console.example"])
def test_other_binds_need_a_token(host: str) -> None:
    assert not sec.is_loopback(host)
    with pytest.raises(InvalidInput, match="FAIRQ_WEB_TOKEN"):
        sec.check_bind(host, None, allow_actions=False)
    sec.check_bind(host, TOKEN, allow_actions=True)


def test_actions_need_a_token_and_a_long_one() -> None:
    with pytest.raises(InvalidInput, match="--allow-actions needs FAIRQ_WEB_TOKEN"):
        sec.check_bind("127.0.0.1", None, allow_actions=True)
    with pytest.raises(InvalidInput, match="at least 16"):
        sec.check_token("short")
    assert sec.check_token("") is None and sec.check_token(TOKEN) == TOKEN


def test_sessions_and_csrf() -> None:
    guard = sec.Guard(TOKEN, allow_actions=True)
    assert guard.token_ok(TOKEN) and not guard.token_ok(TOKEN + "x") and not guard.token_ok("")
    sid, csrf = guard.login()
    assert guard.csrf_for(sid) == csrf and guard.may_act(sid, csrf)
    assert not guard.may_act(sid, None) and not guard.may_act(sid, csrf + "x")
    assert not guard.may_act("forged", csrf) and not guard.may_act(None, csrf)
    other_sid, other_csrf = guard.login()
    assert not guard.may_act(sid, other_csrf)  # one session's token is not another's
    guard.logout(sid)
    assert guard.csrf_for(sid) is None and guard.may_act(other_sid, other_csrf)
    readonly = sec.Guard(TOKEN, allow_actions=False)
    s, c = readonly.login()
    assert not readonly.may_act(s, c)
    assert not sec.Guard(None, True).token_ok("anything")


def test_hosts_and_headers() -> None:
    assert sec.allowed_hosts("0.0.0.0", ["fairq.example"]) == sorted(
        {"localhost", "127.0.0.1", "::1", "[::1]", "0.0.0.0", "fairq.example"})
    assert "script-src 'self'" in sec.CSP and "unsafe-inline" not in sec.CSP
    assert "frame-ancestors 'none'" in sec.CSP


@pytest.mark.parametrize("target,expected", [
    ("/tenants/a?x=1", "/tenants/a?x=1"), ("//evil.example/", "/"), ("https://evil.example", "/"),
    ("/\\evil.example", "/"), (None, "/"), ("", "/")])
def test_login_redirects_stay_here(target: str | None, expected: str) -> None:
    assert _safe_next(target) == expected


def run(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(list(argv))
    return code, err.getvalue()


def test_cli_refuses_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(sec.TOKEN_ENV, raising=False)
    code, err = run("web", "--host", "0.0.0.0", "--dsn", "postgresql://nobody@127.0.0.1:1/x")
    assert code == 2 and err.count("\n") == 1 and "FAIRQ_WEB_TOKEN" in err, err
    code, err = run("web", "--allow-actions", "--dsn", "postgresql://nobody@127.0.0.1:1/x")
    assert code == 2 and err.count("\n") == 1 and "--allow-actions needs" in err, err
    monkeypatch.setenv(sec.TOKEN_ENV, "short")
    code, err = run("web", "--dsn", "postgresql://nobody@127.0.0.1:1/x")
    assert code == 2 and "at least 16" in err


def test_cli_without_the_extra_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "starlette" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    code, err = run("web")
    assert code == 2 and err.count("\n") == 1
    assert "pip install 'fairq[web]'" in err, err
