"""The console inside the user's own ASGI app (FastAPI, Starlette): mounted under a prefix, the
host's authentication says who the caller is and what they may do (``authorize``), the console
keeps its CSRF check on every action and logs who did each one (logger ``fairq.web.audit``).

``fairq web`` keeps its own token login (``fairq.web.server.create_app``); this module adds none.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import logging
import re
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route

from fairq import validation
from fairq.errors import InvalidInput
from fairq.web import limits
from fairq.web import security as sec
from fairq.web.server import (
    Console,
    _Headers,
    _name,
    _Segments,
    is_api,
    root_path,
    route_path,
)

if TYPE_CHECKING:
    from fairq.app import App

__all__ = ["AUDIT_LOGGER", "Access", "Authorize", "console"]

AUDIT_LOGGER = "fairq.web.audit"
audit_log = logging.getLogger(AUDIT_LOGGER)
CSRF_COOKIE = "fairq_console_csrf"
MIN_SECRET = 16
_ACCESS, _NONCE = "fairq.web.access", "fairq.web.csrf_nonce"  # request scope keys
_NONCE_FORM = re.compile(r"[A-Za-z0-9_-]{43}")  # secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Access:
    """What the host's authentication allows one caller: read the pages, act (retry, cancel,
    tenant settings), and the operator's name, recorded with every action."""

    operator: str
    read: bool = True
    act: bool = False

    def __post_init__(self) -> None:
        validation.name("Access.operator", self.operator)
        for flag in ("read", "act"):
            if not isinstance(getattr(self, flag), bool):
                raise InvalidInput(f"Access.{flag} must be True or False")

    @property
    def may_act(self) -> bool:
        return self.read and self.act


# The host's check, given the request as the host's middleware left it (cookies, headers,
# request.state, scope["user"]); async or not. None: not allowed at all.
Authorize = Callable[[Request], Access | Awaitable[Access | None] | None]


def _action_of(request: Request) -> tuple[str, str, str]:
    """(action, "tenant" or "job", the tenant's name or the job's id) of an action's POST."""
    parts = route_path(request).strip("/").split("/")
    if parts[0] == "api":
        parts = parts[1:]
    kind = "job" if parts[0] == "jobs" else "tenant"
    verb = parts[2] if len(parts) > 2 else "set"
    target = str(request.path_params["id"]) if kind == "job" else _name(request)
    return f"{verb}_{kind}", kind, target


def _shown(kind: str, target: str) -> str:
    """The target as logged: a job's id bare, anything else quoted (no line breaks forged)."""
    return target if kind == "job" and target.isascii() and target.isdigit() else repr(target)


class _Mounted(Console):
    """The console's handlers with the host's ``authorize`` in place of the token's login."""

    def __init__(self, app: App, authorize: Authorize, secret: bytes) -> None:
        super().__init__(app, sec.Guard(None, False))
        self.authorize, self.secret = authorize, secret

    async def ask(self, request: Request) -> Access | None:
        """The host's answer for this request (a sync ``authorize`` runs in the threadpool, as
        the handlers do: it may read a database)."""
        found: Any = await run_in_threadpool(self.authorize, request)
        if inspect.isawaitable(found):
            found = await found
        if found is not None and not isinstance(found, Access):
            raise TypeError(f"authorize must return fairq.web.Access or None, not "
                            f"{type(found).__name__}")
        return found

    @staticmethod
    def access(request: Request) -> Access | None:
        found = request.scope.get(_ACCESS)
        return found if isinstance(found, Access) else None

    def csrf(self, request: Request) -> str | None:
        """The CSRF token of this browser (its cookie's nonce) and operator: an HMAC, so a
        form of another operator, browser or console secret does not pass."""
        access, nonce = self.access(request), request.scope.get(_NONCE)
        if access is None or not access.may_act or not isinstance(nonce, str):
            return None
        return hmac.new(self.secret, f"{nonce}\0{access.operator}".encode(),
                        hashlib.sha256).hexdigest()

    def viewer(self, request: Request) -> dict[str, Any]:
        access = self.access(request)
        may_act = access is not None and access.may_act
        return {"csrf": self.csrf(request) if may_act else None, "actions": may_act,
                "own_login": False, "operator": None if access is None else access.operator}

    async def _authorized(self, request: Request) -> tuple[dict[str, Any], int, str | None]:
        access = self.access(request)
        if access is None or not access.may_act:  # refused before the body is read
            self._refused(request, access, "may not act")
            return {}, 403, ("you may read the console but not act (the host app's authorize "
                             "says so)")
        api = is_api(request)
        if api and not sec.same(request.headers.get(sec.CSRF_HEADER) or "", self.csrf(request)):
            self._refused(request, access, "missing or wrong CSRF token")
            return {}, 403, "missing or wrong CSRF token: reload the page"
        fields, status, bad = await self.fields(request)
        if bad is not None:
            return {}, status, bad
        if not api and not sec.same(str(fields.get(sec.CSRF_FIELD) or ""), self.csrf(request)):
            self._refused(request, access, "missing or wrong CSRF token")
            return fields, 403, "missing or wrong CSRF token: reload the page"
        return fields, 200, None

    def _refused(self, request: Request, access: Access | None, why: str) -> None:
        what, kind, target = _action_of(request)
        audit_log.warning("operator=%r action=%s %s=%s refused: %s",
                          None if access is None else access.operator, what, kind,
                          _shown(kind, target), why)

    def audit(self, request: Request, fields: Mapping[str, Any]) -> None:
        """One line per action done: who, what, which tenant or job (and a settings change's
        fields); also as the record's ``operator``, ``action``, ``tenant``/``job`` and
        ``changes`` attributes for a structured handler."""
        access = self.access(request)
        what, kind, target = _action_of(request)
        form = not is_api(request)
        changes = {k: x for k, x in fields.items()
                   if k not in (sec.CSRF_FIELD, "version", "expected_version")
                   and not (form and x == "")} if what == "set_tenant" else {}
        audit_log.info("operator=%r action=%s %s=%s%s",
                       None if access is None else access.operator, what, kind,
                       _shown(kind, target), "".join(f" {k}={x!r}" for k, x in changes.items()),
                       extra={"operator": None if access is None else access.operator,
                              "action": what, kind: target, "changes": changes})

    def routes(self) -> list[Route | Mount]:
        """The pages, the actions and the static files: no login or logout of its own."""
        return [r for r in super().routes() if r.path not in ("/login", "/logout")]


class _Authorize(BaseHTTPMiddleware):
    """Ask the host who this is before any handler runs (the static files excepted: the
    wheel's stylesheet and script); give an operator who may act a CSRF nonce cookie."""

    def __init__(self, app: Any, console: _Mounted) -> None:
        super().__init__(app)
        self.console = console

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        if route_path(request).startswith("/static/"):
            return await call_next(request)
        access = await self.console.ask(request)
        if access is None or not access.read:
            return self.console.error(request, 403, "you may not see the fairq console (the "
                                      "host app's authorize says so)")
        request.scope[_ACCESS] = access
        nonce = request.cookies.get(CSRF_COOKIE)
        fresh = access.may_act and not (nonce and _NONCE_FORM.fullmatch(nonce))
        if fresh:
            nonce = secrets.token_urlsafe(32)
        request.scope[_NONCE] = nonce
        response = await call_next(request)
        if fresh and nonce:
            response.set_cookie(CSRF_COOKIE, nonce, httponly=True, samesite="strict",
                                path=root_path(request) or "/",
                                secure=request.url.scheme == "https")
        return response


def _secret(given: str | bytes | None) -> bytes:
    if given is None:
        return secrets.token_bytes(32)
    raw = given.encode() if isinstance(given, str) else given
    if not isinstance(raw, bytes) or len(raw) < MIN_SECRET:
        raise InvalidInput(f"csrf_secret must be at least {MIN_SECRET} bytes "
                           "(python3 -c 'import secrets; print(secrets.token_urlsafe())')")
    return raw


def console(app: App, *, authorize: Authorize, csrf_secret: str | bytes | None = None
            ) -> Starlette:
    """The console as an ASGI app to mount under a prefix of your own app
    (``host.mount("/ops", console(app, authorize=...))``).

    ``authorize(request)`` returns an ``Access`` or None (403, nothing read). ``csrf_secret``
    signs the forms' CSRF tokens: give every process of the host the same one (by default each
    console makes its own, and a restart makes the open forms ask for a reload).
    """
    if not callable(authorize):
        raise InvalidInput("authorize must be a function of the request returning "
                           "fairq.web.Access or None")
    mounted = _Mounted(app, authorize, _secret(csrf_secret))
    return Starlette(
        routes=mounted.routes(),
        middleware=[Middleware(limits.BodyLimit), Middleware(_Segments), Middleware(_Headers),
                    Middleware(limits.Errors, render=mounted.error),
                    Middleware(_Authorize, console=mounted)],
        exception_handlers=limits.exception_handlers(mounted.error))
