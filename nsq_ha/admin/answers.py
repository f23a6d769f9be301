"""Admin answers read in bounded memory (:func:`fetch`), big JSON parsed in slices
(:func:`parse_json`) and one deadline per call (:func:`within`), so that a lying server cannot
grow the client past its caps, stall the event loop, or hold a call past its deadline.

:func:`fetch` sends one request and reads the answer as it streams in: a declared
``Content-Length`` over the cap is refused before any of the body is read, reading stops as soon
as the body passes the cap, and any ``Content-Encoding`` but ``identity`` (the one asked for) is
refused, so a small compressed answer cannot expand into a big one.

:func:`parse_json` gives what :func:`json.loads` gives, but an object or array bigger than
:data:`WINDOW` characters is walked here, member by member, and the event loop gets a turn
every :data:`SLICE` seconds; everything smaller is parsed at once by the json module's C scanner
(a few milliseconds at most). The json module holds the GIL while it parses, so a thread would
stall the loop just as long: slices on the loop are what bounds the stall.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from nsq_ha.errors import NsqTimeoutError
from nsq_ha.lookup.http import Answer, read_capped

if TYPE_CHECKING:  # httpx is imported where a request is made: nsqd= clients never load it
    import httpx

__all__ = ["SLICE", "WINDOW", "fetch", "parse_json", "within"]

#: the longest JSON text (in characters) parsed in one go by the C scanner
WINDOW = 64 << 10
#: the longest the event loop waits while an answer is parsed, in seconds
SLICE = 0.005
#: objects and arrays bigger than :data:`WINDOW` nested deeper than this are refused
MAX_DEPTH = 64
#: the windows tried, smallest first: a small value costs one small copy
_WIDTHS = (2 << 10, 16 << 10, WINDOW)
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_IDENTITY = {"Accept-Encoding": "identity"}


@contextlib.asynccontextmanager
async def within(limit: float, message: str) -> AsyncIterator[None]:
    """Run the block under one deadline of ``limit`` seconds (connect, requests and every read
    of a body included, however slowly a server trickles); when it passes, the block is
    cancelled and :class:`NsqTimeoutError` (``message``) raised. A timeout of an inner block
    (its own, shorter deadline) goes through as it is."""
    timer = asyncio.timeout(limit)
    try:
        async with timer:
            yield
    except TimeoutError:
        if not timer.expired():
            raise
        raise NsqTimeoutError(message) from None


async def fetch(
    http: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    where: str,
    max_bytes: int,
    limit_name: str,
    params: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
    content: bytes | None = None,
    auth: httpx.Auth | None = None,
) -> Answer:
    """Send ``method url`` and read the answer whole, up to ``max_bytes``; past that a
    :class:`RemoteProtocolError` naming ``where`` and the limit (``limit_name``). httpx errors
    (connect, read, protocol) propagate as they are; the caller bounds the time."""
    import httpx

    request = http.build_request(
        method, url, params=params, headers={**(headers or {}), **_IDENTITY}, content=content
    )
    response = await http.send(
        request, auth=auth if auth is not None else httpx.USE_CLIENT_DEFAULT, stream=True
    )
    return await read_capped(response, where, max_bytes=max_bytes, limit_name=limit_name)


async def parse_json(text: str) -> Any:
    """``text`` parsed as :func:`json.loads` would, in slices of at most :data:`SLICE` seconds;
    :class:`ValueError` when it is not one JSON value (or nests big containers too deep)."""
    slicer = _Slicer(text)
    value, end = await slicer.value(0, 0)
    if _skip(text, end) != len(text):
        raise ValueError(f"extra data after the JSON value at character {end}")
    return value


def _skip(text: str, i: int) -> int:
    match = _WHITESPACE.match(text, i)
    return i if match is None else match.end()


class _Slicer:
    def __init__(self, text: str) -> None:
        self.text = text
        self.scan = json.JSONDecoder().raw_decode
        self.loop = asyncio.get_running_loop()
        self.turn = self.loop.time()
        #: object keys seen, shared as json.loads shares them
        self.keys: dict[str, str] = {}

    async def breathe(self) -> None:
        if self.loop.time() - self.turn >= SLICE:
            await asyncio.sleep(0)
            self.turn = self.loop.time()

    async def value(self, i: int, depth: int) -> tuple[Any, int]:
        text = self.text
        i = _skip(text, i)
        if text.startswith(("{", "["), i):
            small = self.whole(i)
            if small is not None:
                return small
            if depth >= MAX_DEPTH:
                raise ValueError(f"JSON nested more than {MAX_DEPTH} big containers deep")
            if text.startswith("[", i):
                return await self.array(i, depth)
            return await self.object(i, depth)
        # a scalar: the scanner reads a string or number once, to its end (ValueError if none)
        return self.scan(text, i)

    def whole(self, i: int) -> tuple[Any, int] | None:
        """The object or array at ``i`` when it ends within :data:`WINDOW` characters (tried
        in growing windows: a cut container fails to parse), else None."""
        for width in _WIDTHS:
            try:
                value, end = self.scan(self.text[i : i + width], 0)
            except (ValueError, RecursionError):
                if i + width >= len(self.text):  # nothing was cut: the JSON is bad
                    raise ValueError(f"malformed JSON in the value at character {i}") from None
                continue
            return value, i + end
        return None

    async def array(self, i: int, depth: int) -> tuple[list[Any], int]:
        text, items = self.text, list[Any]()
        i = _skip(text, i + 1)
        if text.startswith("]", i):
            return items, i + 1
        while True:
            item, i = await self.value(i, depth + 1)
            items.append(item)
            await self.breathe()
            i = _skip(text, i)
            if text.startswith("]", i):
                return items, i + 1
            if not text.startswith(",", i):
                raise ValueError(f"expected ',' or ']' at character {i}")
            i += 1

    async def object(self, i: int, depth: int) -> tuple[dict[str, Any], int]:
        text, members = self.text, dict[str, Any]()
        i = _skip(text, i + 1)
        if text.startswith("}", i):
            return members, i + 1
        while True:
            if not text.startswith('"', i):
                raise ValueError(f"expected a key at character {i}")
            key, i = self.scan(text, i)  # a JSON string: a str
            key = self.keys.setdefault(key, key)
            i = _skip(text, i)
            if not text.startswith(":", i):
                raise ValueError(f"expected ':' at character {i}")
            members[key], i = await self.value(i + 1, depth + 1)
            await self.breathe()
            i = _skip(text, i)
            if text.startswith("}", i):
                return members, i + 1
            if not text.startswith(",", i):
                raise ValueError(f"expected ',' or '}}' at character {i}")
            i = _skip(text, i + 1)
