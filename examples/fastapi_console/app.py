"""Your own FastAPI app with the fairq console mounted at /ops, behind the app's own login.

    FAIRQ_DATABASE_URL=postgresql://... uvicorn --app-dir examples/fastapi_console app:app

Open http://127.0.0.1:8000/, log in as ``olga`` (an operator: she may retry, cancel and change
tenant settings) or ``rita`` (a reader: she sees the pages only), and follow the link to /ops.

The login here is a toy (two users, their passwords in this file, a signed cookie naming the
user): keep your app's real authentication. The console only needs ``authorize``: from the
request as your middleware left it, who is this and what may they do.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from html import escape

from fastapi import FastAPI, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse

import fairq
from fairq.web import Access, console

# Toy users: name -> (password, may act). Replace with your own user store.
USERS = {"olga": ("olga-password", True), "rita": ("rita-password", False)}
COOKIE = "example_user"
# Signs the user cookie; several worker processes need the same value (the environment).
SECRET = os.environ.get("EXAMPLE_SECRET", "").encode() or secrets.token_bytes(32)


def _sign(name: str) -> str:
    return hmac.new(SECRET, name.encode(), hashlib.sha256).hexdigest()


def current_user(request: Request) -> str | None:
    """The user the cookie names, if its signature holds."""
    name, _, signature = request.cookies.get(COOKIE, "").partition(":")
    if name in USERS and hmac.compare_digest(signature, _sign(name)):
        return name
    return None


def authorize(request: Request) -> Access | None:
    """The console asks this on every request: None (not logged in) gets a 403."""
    name = current_user(request)
    if name is None:
        return None
    return Access(operator=name, read=True, act=USERS[name][1])


def create_host(fq: fairq.App, *, csrf_secret: str | None = None) -> FastAPI:
    """The host app: a home page with the toy login, and the console at /ops."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        fq.close()

    host = FastAPI(title="example host", lifespan=lifespan)

    @host.get("/", response_class=HTMLResponse)
    def home(request: Request) -> str:
        name = current_user(request)
        if name is None:
            return ("<h1>Example app</h1><form method='post' action='/login'>"
                    "<input name='name' id='name' placeholder='olga or rita'> "
                    "<input name='password' id='password' type='password'> "
                    "<button id='login'>Log in</button></form>")
        role = "operator" if USERS[name][1] else "reader"
        return (f"<h1>Example app</h1><p>Logged in as <b id='user'>{escape(name)}</b> ({role})."
                " <a id='console' href='/ops/'>The fairq console</a></p>"
                "<form method='post' action='/logout'><button id='logout'>Log out</button></form>")

    @host.post("/login")
    def login(name: str = Form(), password: str = Form()) -> RedirectResponse:
        known = USERS.get(name)
        if known is None or not hmac.compare_digest(password.encode(), known[0].encode()):
            return RedirectResponse("/", status_code=303)
        resp = RedirectResponse("/ops/", status_code=303)
        resp.set_cookie(COOKIE, f"{name}:{_sign(name)}", httponly=True, samesite="lax")
        return resp

    @host.post("/logout")
    def logout() -> RedirectResponse:
        resp = RedirectResponse("/", status_code=303)
        resp.delete_cookie(COOKIE)
        return resp

    host.mount("/ops", console(fq, authorize=authorize, csrf_secret=csrf_secret))
    return host


# The console's audit lines (who did what, on logger fairq.web.audit) on stderr beside
# uvicorn's; your app's logging configuration would route them instead.
AUDIT = logging.getLogger("fairq.web.audit")
if not AUDIT.handlers:
    AUDIT.addHandler(logging.StreamHandler())
    AUDIT.setLevel(logging.INFO)

# FAIRQ_DATABASE_URL and FAIRQ_SCHEMA say which database (fairq.App connects on first use).
# CONSOLE_CSRF_SECRET: the same for every worker process (uvicorn --workers N).
app = create_host(fairq.App(), csrf_secret=os.environ.get("CONSOLE_CSRF_SECRET") or None)
