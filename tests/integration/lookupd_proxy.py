"""A small lying nsqlookupd for tests: an HTTP server in front of a real (or embedded) lookupd.

It forwards each GET to the upstream lookupd and hands back its answer, except that it

* counts the ``/lookup`` requests per topic (``lookups``);
* answers ``/listlookup`` with ``null`` (a standalone lookupd), so clients keep asking it rather
  than the upstream it hides;
* can lie about ``/lookup``: drop ``meta`` (``strip_meta``) and leave partitions out of the
  ``partitions`` map (``hide_partitions``), as an old or partly informed lookupd would.

One request per connection (``Connection: close``); loopback only.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import urllib.parse
from typing import Any

import httpx

_MAX_HEAD = 64 * 1024


class LookupdProxy:
    """``async with LookupdProxy(upstream) as proxy``: clients use ``proxy.url``."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.strip_meta = False
        self.hide_partitions: set[int] = set()
        #: ``/lookup`` requests per topic
        self.lookups: collections.Counter[str] = collections.Counter()
        self._server: asyncio.Server | None = None
        self._http: httpx.AsyncClient | None = None
        self.url = ""

    async def __aenter__(self) -> LookupdProxy:
        self._http = httpx.AsyncClient(timeout=5.0)
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        if self._http is not None:
            await self._http.aclose()

    @property
    def total_lookups(self) -> int:
        """Every ``/lookup`` request so far."""
        return sum(self.lookups.values())

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            if len(head) > _MAX_HEAD:
                return
            target = head.split(b"\r\n", 1)[0].split(b" ")[1].decode("ascii")
            status, body = await self._answer(target)
            writer.write(
                f"HTTP/1.1 {status} X\r\nContent-Type: application/json; charset=utf-8\r\n"
                "X-NSQ-Content-Type: nsq; version=1.0\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _answer(self, target: str) -> tuple[int, bytes]:
        path, _, query = target.partition("?")
        if path == "/listlookup":
            return 200, b"null"
        params = dict(urllib.parse.parse_qsl(query))
        if path == "/lookup":
            self.lookups[params.get("topic", "")] += 1
        assert self._http is not None
        try:
            resp = await self._http.get(
                f"{self.upstream}{path}",
                params=params,
                headers={"Accept": "application/vnd.nsq; version=1.0"},
            )
        except httpx.HTTPError as exc:
            return 502, json.dumps({"message": f"upstream: {exc!r}"}).encode()
        if path != "/lookup" or resp.status_code != 200:
            return resp.status_code, resp.content
        answer: dict[str, Any] = resp.json()
        if self.strip_meta:
            answer.pop("meta", None)
        parts = answer.get("partitions") or {}
        answer["partitions"] = {
            k: v for k, v in parts.items() if int(k) not in self.hide_partitions
        }
        return 200, json.dumps(answer).encode()
