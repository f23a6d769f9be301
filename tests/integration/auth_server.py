"""A tiny HTTP server speaking nsqd's auth protocol, for tests against nsqd with
``--auth-http-address``: ``GET /auth?remote_ip&tls&secret`` -> grants (JSON) or 403.

Every query it gets is kept in ``queries`` (tests check what nsqd asked, e.g. ``tls=true``).
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

IDENTITY = "test-user"
IDENTITY_URL = "https://example.invalid/test-user"


@dataclass
class AuthServer:
    """Grants publish and subscribe on everything to ``secret``, refuses anything else."""

    secret: str
    queries: list[dict[str, str]] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def address(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"{host!s}:{port}"


def _handler(auth: AuthServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            auth.queries.append(query)
            if url.path != "/auth" or query.get("secret") != auth.secret:
                self.send_response(403)
                self.end_headers()
                return
            grant = {"permissions": ["subscribe", "publish"], "topic": ".*", "channels": [".*"]}
            body = json.dumps(
                {
                    "ttl": 3600,
                    "identity": IDENTITY,
                    "identity_url": IDENTITY_URL,
                    "authorizations": [grant],
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            """Quiet."""

    return Handler


@contextmanager
def running_auth_server(secret: str) -> Iterator[AuthServer]:
    """An :class:`AuthServer` on a free loopback port for the ``with`` block."""
    auth = AuthServer(secret)
    auth.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(auth))
    thread = threading.Thread(target=auth.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield auth
    finally:
        auth.server.shutdown()
        auth.server.server_close()
        thread.join(5)
