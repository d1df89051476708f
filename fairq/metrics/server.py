"""The /metrics + /healthz HTTP server (worker and exporter): a small threading server on a
daemon thread, with health paths answered by callables."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder


class MetricsServer:
    """A running /metrics + /healthz server on a daemon thread."""

    def __init__(self, httpd: ThreadingHTTPServer) -> None:
        self.httpd = httpd
        self.host, self.port = httpd.server_address[0], int(httpd.server_address[1])
        self.thread = threading.Thread(target=httpd.serve_forever, name="fairq-metrics",
                                       daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        """A URL to reach the server from this host (127.0.0.1 when bound to every interface)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else str(self.host)
        return f"http://{host}:{self.port}"

    @property
    def bound_url(self) -> str:
        """The address actually bound, for logs: ``0.0.0.0`` means every interface."""
        host = str(self.host)
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


def serve(port: int, host: str = "0.0.0.0", health: Callable[[], bool] | None = None,
          registry: CollectorRegistry | None = None,
          checks: Mapping[str, Callable[[], bool]] | None = None) -> MetricsServer:
    """Serve ``registry`` on /metrics and ``health`` on /healthz (200 ok / 503 unhealthy), and
    each of ``checks`` (path -> check) likewise (see fairq.metrics.health).

    ``port=0`` picks a free port (see ``MetricsServer.port``). A health callable that raises
    counts as unhealthy. A port in use is ``InvalidInput`` naming it.
    """
    from prometheus_client import REGISTRY

    reg = registry if registry is not None else REGISTRY
    check = health or (lambda: True)
    paths = {"/healthz": check, **(checks or {})}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
                try:
                    body, status = encoder(reg), 200
                except Exception as exc:  # a failing collector: say so, do not hang up
                    body, status = f"# collect failed: {exc}\n".encode(), 500
                    content_type = "text/plain; charset=utf-8"
                self._send(status, body, content_type)
            elif path in paths:
                try:
                    ok = bool(paths[path]())
                except Exception:
                    ok = False
                self._send(200 if ok else 503, b"ok\n" if ok else b"unhealthy\n",
                           "text/plain; charset=utf-8")
            else:
                self._send(404, f"not found: try /metrics or {' '.join(sorted(paths))}\n"
                           .encode(), "text/plain")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # scrapes every few seconds would flood the worker's log

    ThreadingHTTPServer.daemon_threads = True
    try:
        httpd = ThreadingHTTPServer((host, port), Handler)
    except OSError as exc:
        import errno

        from fairq.errors import InvalidInput

        if exc.errno == errno.EADDRINUSE:
            raise InvalidInput(f"cannot serve metrics on {host}:{port}: port {port} is already "
                               "in use (choose another port)") from None
        if exc.errno in (errno.EADDRNOTAVAIL, errno.EACCES):
            raise InvalidInput(f"cannot serve metrics on {host}:{port}: {exc.strerror}") from None
        raise
    return MetricsServer(httpd)
