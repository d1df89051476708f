"""The console's Starlette application: every page as HTML (Jinja2, autoescaped) and as JSON
under /api/, the actions behind ``Guard`` (read-only unless allowed; a session from the token's
login and a CSRF token on every POST), a Host allowlist and the security headers."""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from fairq import __version__
from fairq.errors import InvalidInput
from fairq.store.console import SORTS
from fairq.web import charts, data, limits
from fairq.web import security as sec

if TYPE_CHECKING:
    from fairq.app import App

# Notices after an action (POST, redirect, GET): fixed texts picked by key, never echoed input.
NOTICES = {
    "retried": "Job queued again.", "retried_all": "The tenant's failed jobs were queued again.",
    "cancelled": "Job cancelled.", "cancelled_all": "The tenant's queued jobs were cancelled.",
    "saved": "Settings saved: effective from the next claim.", "login": "Logged in.",
    "logout": "Logged out.",
}
REFRESH_S = 5
WRONG_TOKEN_DELAY_S = 0.5


def _fmt_age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = max(0.0, float(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s / size:.1f}{unit}"
    return f"{s:.1f}s"


def _fmt_pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _fmt_time(at: datetime | None) -> str:
    return "-" if at is None else at.strftime("%Y-%m-%d %H:%M:%S")


def _env() -> Environment:
    env = Environment(loader=PackageLoader("fairq.web", "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True))
    env.filters.update(age=_fmt_age, pct=_fmt_pct, when=_fmt_time, urlpart=lambda s: quote(
        str(s), safe=""), pretty=lambda x: json.dumps(data.jsonable(x), indent=2,
                                                      ensure_ascii=False))
    return env


class Console:
    """The handlers, bound to one ``App`` (its pool) and one ``Guard``."""

    def __init__(self, app: App, guard: sec.Guard) -> None:
        self.app, self.guard = app, guard
        self.env = _env()

    # -- rendering ---------------------------------------------------------------------------
    def viewer(self, request: Request) -> dict[str, Any]:
        """What the pages offer this caller: the CSRF token of its forms (None: no action
        form), whether actions are on, the console's own login links, the operator's name."""
        return {"csrf": self.guard.csrf_for(request.cookies.get(sec.SESSION_COOKIE)),
                "actions": self.guard.allow_actions, "own_login": True, "operator": None}

    def audit(self, request: Request, fields: Mapping[str, Any]) -> None:
        """Called after each action done (the mounted console logs who did it)."""

    def page(self, request: Request, template: str, status: int = 200,
             **context: Any) -> HTMLResponse:
        notice = NOTICES.get(request.query_params.get("notice", ""))
        html = self.env.get_template(template).render(
            request=request, notice=notice, version=__version__, refresh=REFRESH_S,
            path=route_path(request), root=root_path(request), **self.viewer(request),
            **context)
        return HTMLResponse(html, status_code=status)

    @staticmethod
    def json(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(data.jsonable(value), status_code=status, headers=headers)

    def error(self, request: Request, status: int, message: str) -> Response:
        if is_api(request):
            return self.json({"error": message}, status)
        return self.page(request, "error.html", status, message=message, code=status)

    # -- pages -------------------------------------------------------------------------------
    def overview(self, request: Request) -> Response:
        o = data.overview(self.app)
        if is_api(request):
            return self.json(o)
        return self.page(request, "overview.html", o=o, auto=True)

    def tenants(self, request: Request) -> Response:
        q = data.TenantQuery.parse(request.query_params)
        t = data.tenants(self.app, q)
        if is_api(request):
            return self.json(t["tenants"], headers={
                "x-total-count": str(t["total"]), "x-page": str(t["page"]),
                "x-pages": str(t["pages"])})
        return self.page(request, "tenants.html", t=t, q=q, sorts=SORTS,
                         auto=True)

    def tenant(self, request: Request) -> Response:
        if is_api(request):
            return self.json(data.tenant(self.app, _name(request)))
        return self._tenant_page(request)

    def _tenant_page(self, request: Request, status: int = 200,
                     typed: Mapping[str, Any] | None = None,
                     refused: data.FieldError | None = None) -> Response:
        """The tenant's page; after a refused save, with what was typed kept in the form and
        the message beside the field it concerns."""
        t = data.tenant(self.app, _name(request))
        chart = charts.wait_and_share([h["at"].strftime("%H:%M:%S") for h in t["history"]],
                                      [h["wait_seconds"] for h in t["history"]],
                                      [h["share"] for h in t["history"]])
        return self.page(request, "tenant.html", status, t=t, chart=chart,
                         auto=refused is None, typed=typed or {},
                         refused=None if refused is None else
                         {"field": refused.field, "message": str(refused)},
                         groups=data.group_names(self.app))

    async def save_tenant(self, request: Request) -> Response:
        """A tenant's settings change, from the page's form or as JSON: one patch of the
        fields given; the form carries the version it showed, and a save over a newer one is
        refused (409) instead of overwriting."""
        api = is_api(request)
        fields, status, why = await self._authorized(request)
        if why is not None:
            return self.error(request, status, why)
        name = _name(request)
        try:
            result = await run_in_threadpool(data.set_tenant, self.app, name, fields,
                                             form=not api)
        except data.FieldError as exc:
            status = 409 if exc.stale else 400
            if api:
                return self.json({"error": str(exc), "field": exc.field}, status)
            typed = {k: x for k, x in fields.items() if k != sec.CSRF_FIELD}
            return await run_in_threadpool(self._tenant_page, request, status, typed, exc)
        except InvalidInput as exc:
            return self.error(request, 400, str(exc))
        self.audit(request, fields)
        if api:
            return self.json(result)
        return RedirectResponse(_with_notice(root_path(request) + "/tenants/" + quote(
            name, safe=""), "saved"), status_code=303)

    def jobs(self, request: Request) -> Response:
        f = data.job_filters(request.query_params)
        j = data.jobs(self.app, f)
        if is_api(request):
            return self.json(j["jobs"])
        return self.page(request, "jobs.html", j=j, f=f, statuses=data.STATUSES, auto=True)

    def job(self, request: Request) -> Response:
        jid = data.job_id(request.path_params["id"])
        found = self.app.job(jid)
        if found is None:
            return self.error(request, 404, f"no job {jid}")
        if is_api(request):
            return self.json(found)
        return self.page(request, "job.html", job=found)

    # -- login -------------------------------------------------------------------------------
    def login_form(self, request: Request) -> Response:
        if self.guard.token is None:
            return self.error(request, 404, "no token is set: the console is read-only")
        nonce = secrets.token_urlsafe(32)
        resp = self.page(request, "login.html", login_csrf=nonce,
                         next=_safe_next(request.query_params.get("next")))
        resp.set_cookie(sec.LOGIN_COOKIE, nonce, httponly=True, samesite="strict", path="/login",
                        secure=request.url.scheme == "https")
        return resp

    async def login(self, request: Request) -> Response:
        form = await request.form()
        token, csrf = form.get("token"), form.get(sec.CSRF_FIELD)
        if not sec.same(str(csrf or ""), request.cookies.get(sec.LOGIN_COOKIE)):
            return self.error(request, 403, "the login form expired: load it again")
        if not self.guard.token_ok(str(token or "")):
            await asyncio.sleep(WRONG_TOKEN_DELAY_S)  # guessing costs time
            return self.error(request, 403, "wrong token")
        sid, _csrf = self.guard.login()
        target = root_path(request) + _safe_next(str(form.get("next") or "/"))
        resp = RedirectResponse(_with_notice(target, "login"), status_code=303)
        resp.set_cookie(sec.SESSION_COOKIE, sid, httponly=True, samesite="strict", path="/",
                        secure=request.url.scheme == "https")
        resp.delete_cookie(sec.LOGIN_COOKIE, path="/login")
        return resp

    async def logout(self, request: Request) -> Response:
        """The session ends only with its CSRF token: another site cannot log anyone out."""
        sid = request.cookies.get(sec.SESSION_COOKIE)
        expected = self.guard.csrf_for(sid)
        if expected is not None:
            fields, status, bad = await self.fields(request)
            if bad is not None:
                return self.error(request, status, bad)
            if not sec.same(str(fields.get(sec.CSRF_FIELD) or ""), expected):
                return self.error(request, 403, "missing or wrong CSRF token: reload the page")
            self.guard.logout(sid)
        resp = RedirectResponse(root_path(request) + "/?notice=logout", status_code=303)
        resp.delete_cookie(sec.SESSION_COOKIE, path="/")
        return resp

    # -- actions -----------------------------------------------------------------------------
    @staticmethod
    async def fields(request: Request) -> tuple[dict[str, Any], int, str | None]:
        """The POST's fields (a JSON object under /api/, else the form), and why they are
        refused: (fields, status, None) when they parse, else ({}, 400 or 415, why)."""
        kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if not is_api(request):
            if not kind:  # no body (a button without fields): an empty form
                return {}, 200, None
            if kind not in ("application/x-www-form-urlencoded", "multipart/form-data"):
                return {}, 415, "a form's body must be application/x-www-form-urlencoded"
            return {k: str(x) for k, x in (await request.form()).items()}, 200, None
        body = await request.body()
        if not body:
            return {}, 200, None
        if kind != "application/json":
            return {}, 415, "the body must be JSON (Content-Type: application/json)"
        try:
            parsed = json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: nested past Python's stack
            return {}, 400, "the body is not JSON"
        if not isinstance(parsed, dict):
            return {}, 400, "the body must be a JSON object"
        return parsed, 200, None

    async def _authorized(self, request: Request) -> tuple[dict[str, Any], int, str | None]:
        """The POST's fields, and why it is refused: (fields, 200, None) when it may act.
        Who is asking is checked from the headers first, so a caller who may not act gets
        403 without its body read; then the body's type (415) and syntax (400)."""
        api = is_api(request)
        if not self.guard.allow_actions:
            return {}, 403, "the console is read-only: start it with --allow-actions"
        auth = request.headers.get("authorization", "")
        sid = request.cookies.get(sec.SESSION_COOKIE)
        if api and auth.lower().startswith("bearer "):
            if not self.guard.token_ok(auth[7:].strip()):
                return {}, 403, "wrong token"
        elif self.guard.csrf_for(sid) is None:
            return {}, 403, "log in first (the token of FAIRQ_WEB_TOKEN)"
        elif api and not self.guard.may_act(sid, request.headers.get(sec.CSRF_HEADER)):
            return {}, 403, "missing or wrong CSRF token: reload the page"
        fields, status, bad = await self.fields(request)
        if bad is not None:
            return {}, status, bad
        if not api and not self.guard.may_act(sid, fields.get(sec.CSRF_FIELD)):
            return fields, 403, "missing or wrong CSRF token: reload the page"
        return fields, 200, None

    def _action(self, work: Callable[[Request, dict[str, Any]], Any], notice: str,
                back: Callable[[Request], str]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            fields, status, refused = await self._authorized(request)
            if refused is not None:
                return self.error(request, status, refused)
            try:
                result = await run_in_threadpool(work, request, fields)
            except InvalidInput as exc:
                return self.error(request, 400, str(exc))
            self.audit(request, fields)
            if is_api(request):
                return self.json(result)
            return RedirectResponse(_with_notice(root_path(request) + back(request), notice),
                                    status_code=303)
        return endpoint

    def routes(self) -> list[Route | Mount]:
        name = "{name:str}"
        job = "{id:str}"

        def tenant_back(r: Request) -> str:
            return "/tenants/" + quote(_name(r), safe="")

        def job_back(r: Request) -> str:
            return "/jobs/" + quote(r.path_params["id"])
        actions = {
            f"/tenants/{name}/retry": (lambda r, f: data.retry_tenant(
                self.app, _name(r)), "retried_all", tenant_back),
            f"/tenants/{name}/cancel": (lambda r, f: data.cancel_tenant(
                self.app, _name(r)), "cancelled_all", tenant_back),
            f"/jobs/{job}/retry": (lambda r, f: data.retry_job(
                self.app, data.job_id(r.path_params["id"])), "retried", job_back),
            f"/jobs/{job}/cancel": (lambda r, f: data.cancel_job(
                self.app, data.job_id(r.path_params["id"])), "cancelled", job_back),
        }
        out: list[Route | Mount] = []
        for prefix in ("", "/api"):
            out += [
                Route(prefix + "/" if not prefix else "/api/overview", self.overview),
                Route(prefix + "/tenants", self.tenants),
                Route(prefix + f"/tenants/{name}", self.tenant, methods=["GET"]),
                Route(prefix + f"/tenants/{name}", self.save_tenant, methods=["POST"]),
                Route(prefix + "/jobs", self.jobs),
                Route(prefix + f"/jobs/{job}", self.job, methods=["GET"]),
            ]
            for path, (work, notice, back) in actions.items():
                out.append(Route(prefix + path, self._action(work, notice, back),
                                 methods=["POST"]))
        out += [
            Route("/login", self.login_form, methods=["GET"]),
            Route("/login", self.login, methods=["POST"]),
            Route("/logout", self.logout, methods=["POST"]),
            Mount("/static", StaticFiles(packages=[("fairq.web", "static")]), name="static"),
        ]
        return out


_KEPT = re.compile(r"(%2[fF]|%25)")


def _keep_slashes(raw: bytes) -> str:
    """The request path decoded except for ``%2F`` and ``%25``, so that a name holding ``/``
    stays one path segment; ``_name`` decodes the rest."""
    parts = _KEPT.split(raw.decode("ascii", "replace"))
    return "".join(p if _KEPT.fullmatch(p) else unquote(p) for p in parts)


def root_path(request: Request) -> str:
    """The prefix the console is mounted under ("" at the root): every link starts with it."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def route_path(request: Request) -> str:
    """The path inside the console (the mount's prefix removed), as its routes see it."""
    path, root = request.url.path, root_path(request)
    return (path[len(root):] or "/") if root and path.startswith(root) else path


def is_api(request: Request) -> bool:
    return route_path(request).startswith("/api/")


def _name(request: Request) -> str:
    """The tenant name of the URL (any text the CLI accepts, ``/`` and ``%`` included)."""
    return unquote(request.path_params["name"])


class _Segments:
    """ASGI: route on the path with encoded slashes kept (``_keep_slashes``)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        raw = scope.get("raw_path") if scope["type"] == "http" else None
        if raw:
            scope = {**scope, "path": _keep_slashes(raw.split(b"?", 1)[0])}
        await self.app(scope, receive, send)


def _safe_next(target: str | None) -> str:
    """A local path to go back to after the login (never another site)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _with_notice(target: str, notice: str) -> str:
    return target + ("&" if "?" in target else "?") + "notice=" + notice


class _Login(BaseHTTPMiddleware):
    """With ``Guard.login_required`` (a non-loopback bind): the login first, for every page."""

    def __init__(self, app: Any, guard: sec.Guard) -> None:
        super().__init__(app)
        self.guard = guard

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        path = request.url.path
        if path in ("/login", "/logout") or path.startswith("/static/") or self.guard.may_read(
                request.cookies.get(sec.SESSION_COOKIE), request.headers.get("authorization")):
            return await call_next(request)
        if path.startswith("/api/"):
            return JSONResponse({"error": "log in first (the token of FAIRQ_WEB_TOKEN, or "
                                          "Authorization: Bearer)"}, status_code=401)
        return RedirectResponse("/login?next=" + quote(path, safe="/"), status_code=303)


class _Headers(BaseHTTPMiddleware):
    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        response = await call_next(request)
        for k, x in sec.HEADERS.items():
            response.headers.setdefault(k, x)
        return response


def create_app(app: App, *, guard: sec.Guard, hosts: list[str]) -> Starlette:
    """The ASGI application of ``fairq web``."""
    console = Console(app, guard)
    return Starlette(
        routes=console.routes(),
        middleware=[Middleware(limits.BodyLimit), Middleware(_Segments),
                    Middleware(TrustedHostMiddleware, allowed_hosts=hosts),
                    Middleware(_Headers), Middleware(limits.Errors, render=console.error),
                    Middleware(_Login, guard=guard)],
        exception_handlers=limits.exception_handlers(console.error))
