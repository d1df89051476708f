"""What no request may cost the console: a body past ``MAX_BODY`` is refused with 413 before
it is read (from its Content-Length, or as soon as a chunked body passes the limit), on every
route and before any check of who is asking; and an unexpected failure answers with a fixed
message, the same security headers as every answer, and one line in the log."""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from fairq.errors import InvalidInput
from fairq.store import errors
from fairq.web import security as sec

log = logging.getLogger("fairq.web")

MAX_BODY = 1024 * 1024  # a JSON patch or a form is a few hundred bytes
TOO_LARGE = f"the request's body is over {MAX_BODY // 1024} KiB"
REFUSED = "fairq.body_limit"  # the scope's key of BodyLimit's state

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
# How a failure is shown: the console's own error page or JSON (``Console.error``).
Render = Callable[[Request, int, str], Response]


class BodyLimit:
    """ASGI: refuse a body past ``limit`` bytes. A declared length over it is answered at once,
    unread. A body without one is counted as the console reads it: when it passes the limit,
    the 413 goes out, the console is told the client left, and whatever it answers is dropped.
    Nothing is read ahead: a caller refused for who it is (403) has none of its body read."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            await _plain(scope, send, 413, TOO_LARGE)
            return
        # Shared by the copies of the scope the middlewares inside make (Errors reads it).
        state = {"seen": 0, "refused": False}

        async def counted() -> Message:
            if state["refused"]:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                state["seen"] += len(message.get("body", b""))
                if state["seen"] > self.limit:
                    state["refused"] = True
                    await _plain(scope, send, 413, TOO_LARGE)
                    return {"type": "http.disconnect"}
            return message

        async def guarded(message: Message) -> None:
            if not state["refused"]:
                await send(message)

        try:
            await self.app({**scope, REFUSED: state}, counted, guarded)
        except Exception:
            if not state["refused"]:
                raise  # what the middlewares made of the client "leaving": the 413 is out


class Errors:
    """ASGI, inside the security headers' reach: any exception a handler did not turn into an
    answer becomes a 500 with a fixed message naming a reference, logged once on one line with
    that reference (the traceback only at DEBUG), and never reaches the server's own handler."""

    def __init__(self, app: ASGIApp, render: Render) -> None:
        self.app, self.render = app, render

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception as exc:
            if scope.get(REFUSED, {}).get("refused"):
                return  # answered 413 already; the console only saw its client leave
            ref = secrets.token_hex(4)
            log.error("console: %s %s failed (ref %s): %s: %s", scope.get("method"),
                      _printable(scope.get("path", "")), ref, type(exc).__name__,
                      _printable(" ".join(str(exc).split())[:300]))
            log.debug("console failure ref %s", ref, exc_info=True)
            if started:  # half an answer is out: nothing better to do than to cut it
                raise
            response = internal_error(self.render, Request(scope), ref)
            await response(scope, receive, send)


def exception_handlers(render: Render) -> dict[Any, Callable[[Request, Exception], Response]]:
    """Bad input as 400, a role without the grant as 403, a slow or absent database as 503:
    each one line, as a page or as JSON."""

    def invalid(request: Request, exc: Exception) -> Response:
        return render(request, 400, str(exc))

    def failed(request: Request, exc: Exception) -> Response:
        if isinstance(exc, errors.InsufficientPrivilege):
            return render(request, 403, "the console's database role may not do this: grant "
                          "it with fairq roles --console ROLE --console-actions (docs/roles.md)")
        if isinstance(exc, errors.QueryCanceled):
            return render(request, 503, "the database took too long; try again")
        if isinstance(exc, errors.OperationalError):
            return render(request, 503, "the database does not answer")
        ref = secrets.token_hex(4)  # any other database error: its text stays in the log
        log.error("console: %s %s failed (ref %s): %s: %s", request.method,
                  _printable(request.url.path), ref, type(exc).__name__,
                  _printable(" ".join(str(exc).split())[:300]))
        return internal_error(render, request, ref)

    def not_found(request: Request, exc: Exception) -> Response:
        return render(request, 404, "no such page")

    def too_large(request: Request, exc: Exception) -> Response:
        return render(request, 413, TOO_LARGE)

    return {InvalidInput: invalid, errors.DatabaseError: failed, 404: not_found,
            413: too_large}


def internal_error(render: Render, request: Request, ref: str) -> Response:
    """The 500 answer: a fixed message (the exception's text stays in the log)."""
    try:
        response = render(request, 500, f"the console failed (reference {ref} in its log)")
    except Exception:  # the page itself cannot be drawn
        response = Response(f"the console failed (reference {ref} in its log)\n", 500,
                            media_type="text/plain")
    for k, x in sec.HEADERS.items():
        response.headers.setdefault(k, x)
    return response


def _content_length(scope: Scope) -> int | None:
    for key, value in scope.get("headers", ()):
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _plain(scope: Scope, send: Send, status: int, message: str) -> None:
    """An answer made here, before any route: JSON under /api/, text otherwise."""
    api = "/api/" in scope.get("path", "")
    body = (json.dumps({"error": message}) if api else message + "\n").encode()
    headers = [(k.encode(), x.encode()) for k, x in sec.HEADERS.items()]
    headers += [(b"content-type", b"application/json" if api else b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _printable(path: str) -> str:
    """A request path for a log line: cut, control characters escaped (a path is user text)."""
    cut = path[:200]
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in cut)
