"""The embedded broker's HTTP layer: a small asyncio HTTP/1.1 server on h11, and NSQ's envelopes.

:class:`HttpServer` serves one :data:`Handler` (``Request -> Response``) over keep-alive
HTTP/1.1 connections.  Request bodies may come with ``Content-Length`` or chunked (h11 decodes
both; a handler that must tell them apart, as nsqd's ``/pub`` does, looks for the
``content-length`` header); a request larger than ``max_request_size`` gets 413 and the
connection is closed.  A handler that raises answers 500 ``{"message":"INTERNAL_ERROR"}``, the
body Go's ``http_api.LogPanicHandler`` writes, and the exception is logged.  Like Go's
``net/http``, every response gets a ``Date`` header, and a non-empty body without a
``Content-Type`` is labelled ``text/plain; charset=utf-8`` (Go sniffs; the NSQ daemons only ever
send text or JSON this way).

The rest of the module is what both daemons share (``internal/http_api`` in youzan/nsq,
PROTOCOL.md §5.1): the three response wrappers (:func:`render` with ``"plain"``,
``"negotiate"`` or ``"v1"``), :class:`ApiError` (``http_api.Err``), a path router
(:func:`dispatch`: unknown path 404 ``NOT_FOUND``, wrong method 405 ``METHOD_NOT_ALLOWED``, both
in the v1 shape as julienschmidt/httprouter answers there) and Go-compatible helpers
(:func:`go_json`, :func:`go_atoi`, :func:`go_marshal_decoded`, :func:`go_time_string`).

Deliberate differences from Go's server: no trailing-slash redirects, no automatic ``OPTIONS``
answer, a query key given twice keeps its last value (Go's ``Values.Get`` takes the first), and
an HTTP/1.0 request is answered with an HTTP/1.1 status line and ``Connection: close`` (h11).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import http
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Literal
from urllib.parse import parse_qsl, unquote, urlsplit

try:
    import h11
except ModuleNotFoundError as exc:  # the client's own install has no need of it: say the extra
    raise ModuleNotFoundError(
        "nsq_ha.devcluster (the embedded broker) needs h11, which is not installed: "
        "pip install 'nsq-ha[devcluster]' (the cli extra includes it)",
        name="h11",
    ) from exc

__all__ = [
    "JSON_TYPE",
    "MAX_REQUEST_SIZE",
    "V1_ACCEPT",
    "ApiError",
    "Handler",
    "HttpServer",
    "Request",
    "Response",
    "Route",
    "dispatch",
    "go_atoi",
    "go_json",
    "go_marshal_decoded",
    "go_time_string",
    "render",
    "wants_v1",
]

log = logging.getLogger("nsq_ha.devcluster.http")

#: largest request (head and body) a connection accepts
MAX_REQUEST_SIZE = 16 * 1024 * 1024
#: the Accept value that selects the v1 form of a negotiated response (compared exactly, as Go)
V1_ACCEPT = "application/vnd.nsq; version=1.0"
JSON_TYPE = "application/json; charset=utf-8"
TEXT_TYPE = "text/plain; charset=utf-8"
#: Go writes ``X-NSQ-Content-Type``; its header canonicalisation puts this on the wire
NSQ_CONTENT_TYPE = ("X-Nsq-Content-Type", "nsq; version=1.0")
_READ_CHUNK = 64 * 1024
_MAX_HEAD = 64 * 1024


@dataclass(frozen=True, slots=True)
class Request:
    """One HTTP request as a handler sees it."""

    method: str
    path: str
    #: query parameters, percent-decoded; a repeated key keeps its last value, blank values kept
    query: dict[str, str]
    #: header names lower-cased; a repeated header keeps its first value (Go's ``Header.Get``)
    headers: dict[str, str]
    body: bytes


@dataclass(slots=True)
class Response:
    """What a handler answers; ``Date`` and ``Content-Length`` are added by the server."""

    status: int = 200
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)


Handler = Callable[[Request], Awaitable[Response]]


class _ClientGone(Exception):
    """The peer closed the connection in the middle of a request."""


class _TooLarge(Exception):
    """The request exceeds ``max_request_size``."""


class HttpServer:
    """An HTTP/1.1 server for one handler: keep-alive, bounded requests, clean shutdown."""

    def __init__(
        self,
        handler: Handler,
        host: str,
        port: int = 0,
        *,
        max_request_size: int = MAX_REQUEST_SIZE,
    ) -> None:
        self._handler = handler
        self.host = host
        self.port = port
        self.max_request_size = max_request_size
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        state = "serving" if self._server is not None else "closed"
        return f"<HttpServer {self.host}:{self.port} {state} connections={len(self._connections)}>"

    async def start(self) -> int:
        """Start listening; returns the port (the bound one when ``port`` was 0)."""
        if self._server is not None:
            raise RuntimeError("HttpServer already started")
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def close(self) -> None:
        """Stop listening and close every open connection (requests in progress are cut)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        tasks = list(self._connections)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        try:
            await self._serve(reader, writer)
        except (ConnectionError, _ClientGone):
            pass
        except asyncio.CancelledError:
            # Cut by close(): end as a finished task.  asyncio's own done callback of a
            # connection (3.11.7 and 3.12.1; 3.13.0 checks task.cancelled() first) asks a
            # cancelled task for its exception and reports the CancelledError to the loop.
            if self._server is not None:
                raise
        except Exception:  # a server bug must not kill the loop's error handler
            log.exception("HTTP connection failed")
        finally:
            if task is not None:
                self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_HEAD)
        while True:
            try:
                event = await self._next_event(conn, reader, writer)
                if isinstance(event, h11.ConnectionClosed):
                    return
                if not isinstance(event, h11.Request):
                    return
                request = await self._read_request(conn, event, reader, writer)
            except h11.RemoteProtocolError as exc:
                status = exc.error_status_hint
                await self._send_simple(conn, writer, status, http.HTTPStatus(status).phrase)
                return
            except _TooLarge:
                await self._send_simple(conn, writer, 413, "Request Entity Too Large")
                return
            response = await self._call(request)
            await self._send(conn, writer, response, head=request.method == "HEAD")
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()

    async def _next_event(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        """The next event; never NEED_DATA (PAUSED only if called out of turn)."""
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            if conn.they_are_waiting_for_100_continue:
                interim = h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue")
                writer.write(conn.send(interim))
                await writer.drain()
            conn.receive_data(await reader.read(_READ_CHUNK))

    async def _read_request(
        self,
        conn: h11.Connection,
        head: h11.Request,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> Request:
        headers: dict[str, str] = {}
        for name, value in head.headers:
            headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_request_size:
            raise _TooLarge
        chunks: list[bytes] = []
        size = 0
        while True:
            event = await self._next_event(conn, reader, writer)
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > self.max_request_size:
                    raise _TooLarge
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
            else:
                raise _ClientGone
        target = urlsplit(head.target.decode("latin-1"))
        return Request(
            method=head.method.decode("latin-1").upper(),
            path=unquote(target.path),
            query=dict(parse_qsl(target.query, keep_blank_values=True)),
            headers=headers,
            body=b"".join(chunks),
        )

    async def _call(self, request: Request) -> Response:
        try:
            return await self._handler(request)
        except Exception:
            log.exception("HTTP handler failed on %s %s", request.method, request.path)
            headers = [("Content-Type", JSON_TYPE), NSQ_CONTENT_TYPE]
            return Response(500, b'{"message":"INTERNAL_ERROR"}', headers)

    async def _send(
        self, conn: h11.Connection, writer: asyncio.StreamWriter, response: Response, *, head: bool
    ) -> None:
        headers = list(response.headers)
        if response.body and not any(k.lower() == "content-type" for k, _ in headers):
            headers.append(("Content-Type", TEXT_TYPE))
        headers.append(("Date", email.utils.formatdate(usegmt=True)))
        headers.append(("Content-Length", str(len(response.body))))
        try:
            reason = http.HTTPStatus(response.status).phrase
        except ValueError:
            reason = ""
        data = conn.send(
            h11.Response(status_code=response.status, headers=headers, reason=reason.encode())
        )
        if response.body and not head:
            data += conn.send(h11.Data(data=response.body))
        data += conn.send(h11.EndOfMessage())
        writer.write(data)
        await writer.drain()

    async def _send_simple(
        self, conn: h11.Connection, writer: asyncio.StreamWriter, status: int, text: str
    ) -> None:
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        with contextlib.suppress(h11.LocalProtocolError, ConnectionError):
            await self._send(
                conn, writer, Response(status, text.encode(), [("Connection", "close")]), head=False
            )


# -- NSQ's response envelopes (internal/http_api/api_response.go) -----------------------------


class ApiError(Exception):
    """An error answer of an endpoint: HTTP ``status`` and the message text (``http_api.Err``)."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


Wrapper = Literal["plain", "negotiate", "v1"]
#: an endpoint returns its result (``None``, ``str``, ``bytes`` or JSON data) or raises ApiError
Endpoint = Callable[[Request], object]


@dataclass(frozen=True, slots=True)
class Route:
    """One path of an API: the methods it accepts, its wrapper and its endpoint."""

    methods: frozenset[str]
    wrapper: Wrapper
    endpoint: Endpoint


def wants_v1(request: Request) -> bool:
    """True when the request asks for the v1 form (Go compares the Accept value exactly)."""
    return request.headers.get("accept") == V1_ACCEPT


def go_json(value: object) -> bytes:
    """Serialise like Go's ``json.Marshal``: compact, UTF-8, ``<``, ``>``, ``&``, U+2028 and
    U+2029 escaped.  Dict keys keep their order: callers order them as Go would (struct field
    order, or sorted for Go maps)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    for raw, escaped in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(raw, escaped)
    return text.encode()


_ATOI_RE = re.compile(r"[+-]?[0-9]+\Z")


def go_atoi(text: str, func: str = "Atoi") -> int:
    """Go's ``strconv.Atoi`` (64-bit); ValueError with Go's message on failure."""
    quoted = json.dumps(text, ensure_ascii=False)
    if not _ATOI_RE.match(text):
        raise ValueError(f"strconv.{func}: parsing {quoted}: invalid syntax")
    value = int(text)
    if not -(1 << 63) <= value < 1 << 63:
        raise ValueError(f"strconv.{func}: parsing {quoted}: value out of range")
    return value


def go_marshal_decoded(value: object) -> str:
    """``json.Marshal`` of what Go's ``json.Unmarshal`` made of a JSON value: objects with
    sorted keys at every level, numbers as float64 (``json.loads(..., parse_int=float)`` gives
    the same Python values)."""
    if isinstance(value, dict):
        items = (f"{go_marshal_decoded(k)}:{go_marshal_decoded(value[k])}" for k in sorted(value))
        return "{" + ",".join(items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(go_marshal_decoded(item) for item in value) + "]"
    if isinstance(value, float):
        return _go_float(value)
    return go_json(value).decode()


def _go_float(number: float) -> str:
    """A float64 as encoding/json writes it: integral below 1e21 without a point, exponent
    form below 1e-6 or from 1e21 (``e-7``, not ``e-07``), else plain decimal."""
    size = abs(number)
    if number == int(number) and size < 1e21:
        return str(int(number))
    if size < 1e-6 or size >= 1e21:
        return re.sub(r"e-0(\d)$", r"e-\1", repr(number))
    return format(Decimal(repr(number)), "f")


def go_time_string(ns: int) -> str:
    """Go's ``time.Time.String()`` of a Unix-nanosecond time, in UTC."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    text = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds))
    if fraction:
        text += "." + f"{fraction:09d}".rstrip("0")
    return text + " +0000 UTC"


def _raw(data: str | bytes) -> bytes:
    return data.encode() if isinstance(data, str) else data


def _respond_v1(status: int, data: object) -> Response:
    """``RespondV1``: raw string/bytes, empty for None, JSON otherwise; errors ``{"message"}``."""
    headers: list[tuple[str, str]] = []
    if status != 200:
        # built with Sprintf on the real server: no JSON escaping of the text
        body = f'{{"message":"{data}"}}'.encode()
        headers.append(("Content-Type", JSON_TYPE))
    elif data is None:
        body = b""
    elif isinstance(data, str | bytes):
        body = _raw(data)
    else:
        body = go_json(data)
        headers.append(("Content-Type", JSON_TYPE))
    headers.append(NSQ_CONTENT_TYPE)
    return Response(status, body, headers)


def _respond_wrapped(status: int, status_txt: str, data: object) -> Response:
    """``Respond``: strings raw, anything else in ``{"status_code","status_txt","data"}``."""
    if isinstance(data, str | bytes):
        return Response(status, _raw(data))
    body = go_json({"status_code": status, "status_txt": status_txt, "data": data})
    return Response(status, body, [("Content-Type", JSON_TYPE)])


def render(wrapper: Wrapper, request: Request, result: object) -> Response:
    """Turn an endpoint's result (or :class:`ApiError`) into a response with ``wrapper``.

    * ``plain``: status + raw text;
    * ``v1``: always the v1 form (raw JSON, ``{"message":...}`` errors with their status, the
      ``X-Nsq-Content-Type`` header);
    * ``negotiate``: the v1 form when the request sends ``Accept: application/vnd.nsq;
      version=1.0``, else the wrapped form, where every error is HTTP 500.
    """
    if wrapper == "plain":
        if isinstance(result, ApiError):
            return Response(result.status, result.text.encode())
        if not isinstance(result, str | bytes):
            raise TypeError(f"plain endpoints answer text, not {type(result).__name__}")
        return Response(200, _raw(result))
    if wrapper == "v1" or wants_v1(request):
        if isinstance(result, ApiError):
            return _respond_v1(result.status, result.text)
        return _respond_v1(200, result)
    if isinstance(result, ApiError):
        return _respond_wrapped(500, result.text, None)
    return _respond_wrapped(200, "OK", result)


def dispatch(routes: Mapping[str, Route], request: Request) -> Response:
    """Route ``request`` by path and method, run the endpoint and wrap its result."""
    route = routes.get(request.path)
    if route is None:
        return render("v1", request, ApiError(404, "NOT_FOUND"))
    if request.method not in route.methods:
        response = render("v1", request, ApiError(405, "METHOD_NOT_ALLOWED"))
        response.headers.insert(0, ("Allow", ", ".join(sorted(route.methods))))
        return response
    try:
        result = route.endpoint(request)
    except ApiError as exc:
        result = exc
    return render(route.wrapper, request, result)
