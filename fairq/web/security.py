"""What keeps the console safe to expose: read-only unless actions are allowed, a token for
actions (compared in constant time), a login that sets an HttpOnly, SameSite=Strict session
cookie, a CSRF token on every form and JSON POST, a Host header allowlist and a strict
Content-Security-Policy (no inline script)."""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import threading
from dataclasses import dataclass, field

from fairq.errors import InvalidInput

TOKEN_ENV = "FAIRQ_WEB_TOKEN"
SESSION_COOKIE = "fairq_session"
LOGIN_COOKIE = "fairq_login"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"
MAX_SESSIONS = 1000
MIN_TOKEN = 16

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` serves this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_token(token: str | None) -> str | None:
    """The token from the environment, refused when too short to guess-proof (None: unset)."""
    if token is None or token == "":
        return None
    if len(token) < MIN_TOKEN:
        raise InvalidInput(f"{TOKEN_ENV} must be at least {MIN_TOKEN} characters "
                           "(python3 -c 'import secrets; print(secrets.token_urlsafe())')")
    return token


def check_bind(host: str, token: str | None, allow_actions: bool) -> None:
    """Refuse, in one line, what would expose the console unprotected."""
    if not is_loopback(host) and token is None:
        raise InvalidInput(f"--host {host} serves other machines: set {TOKEN_ENV} first (or bind "
                           "127.0.0.1 behind a reverse proxy)")
    if allow_actions and token is None:
        raise InvalidInput(f"--allow-actions needs {TOKEN_ENV} (at least {MIN_TOKEN} characters): "
                           "actions are behind a login with that token")


def allowed_hosts(host: str, extra: list[str]) -> list[str]:
    """The Host header values served: the loopback names, the bound address, and ``extra``
    (the names a reverse proxy forwards)."""
    hosts = [*LOOPBACK_NAMES, host.strip("[]"), *extra]
    if "::1" in hosts:
        hosts.append("[::1]")
    return sorted(set(hosts))


@dataclass
class Guard:
    """The token, whether actions are allowed, and the live sessions (in memory: a restart
    logs everyone out), each with its CSRF token."""

    token: str | None
    allow_actions: bool
    # Bound beyond loopback: every page needs the login (or the bearer token), reads too.
    login_required: bool = False
    _sessions: dict[str, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def token_ok(self, given: str | None) -> bool:
        """``given`` is the token (constant-time comparison)."""
        if self.token is None or not given:
            return False
        return hmac.compare_digest(given.encode(), self.token.encode())

    def login(self) -> tuple[str, str]:
        """A new session: (session id, its CSRF token)."""
        sid, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        with self._lock:
            if len(self._sessions) >= MAX_SESSIONS:
                self._sessions.pop(next(iter(self._sessions)))
            self._sessions[sid] = csrf
        return sid, csrf

    def logout(self, sid: str | None) -> None:
        with self._lock:
            self._sessions.pop(sid or "", None)

    def csrf_for(self, sid: str | None) -> str | None:
        """The session's CSRF token (None: no such session)."""
        if not sid:
            return None
        with self._lock:
            return self._sessions.get(sid)

    def may_read(self, sid: str | None, authorization: str | None) -> bool:
        """A request may see the pages: no login required, a live session, or the bearer
        token."""
        if not self.login_required or self.csrf_for(sid) is not None:
            return True
        auth = authorization or ""
        return auth.lower().startswith("bearer ") and self.token_ok(auth[7:].strip())

    def may_act(self, sid: str | None, csrf: str | None) -> bool:
        """A POST may change something: actions allowed, a live session, its CSRF token."""
        expected = self.csrf_for(sid)
        return (self.allow_actions and expected is not None and csrf is not None
                and hmac.compare_digest(csrf.encode(), expected.encode()))


def same(a: str | None, b: str | None) -> bool:
    """Two secrets equal (constant time); False when either is missing."""
    return bool(a) and bool(b) and hmac.compare_digest(str(a).encode(), str(b).encode())
