"""nsqd's HTTP admin calls on one node (:class:`NsqdAdmin`), the error every admin refusal
raises (:class:`AdminError`; :class:`PartitionEmptyError` for a seek into a partition that never
had a message) and the ``/channel/setoffset`` position (:func:`seek_position`).

The fork's channel calls go to the partition's leader and name the ``partition``; vanilla nsqd
has no partitions (leave ``partition`` out), no ``/channel/setoffset`` or ``/channel/setorder``,
and deletes a topic with its own ``/topic/delete`` (the fork's nsqd has none: nsqlookupd does).

Every call has one deadline, the client's ``timeout``, and reads nsqd's answer up to a cap
(:data:`MAX_STATS_BYTES` and :data:`MAX_STATS_VALUES` for ``/stats``, whose JSON is parsed in
slices that leave the event loop free, :data:`MAX_REPLY_BYTES` for the others).
"""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from nsq_ha.durations import seconds
from nsq_ha.errors import ConfigError, DiscoveryError, RemoteProtocolError
from nsq_ha.lookup.http import ADMIN_TIMEOUT, tls_context
from nsq_ha.lookup.wire import V1_ACCEPT

from .answers import fetch, parse_json, within

if TYPE_CHECKING:  # httpx is imported where a request is made: nsqd= clients never load it
    import httpx

__all__ = [
    "MAX_REPLY_BYTES",
    "MAX_STATS_BYTES",
    "MAX_STATS_VALUES",
    "AdminError",
    "NsqdAdmin",
    "PartitionEmptyError",
    "seek_position",
]

#: the largest ``/stats`` answer :meth:`NsqdAdmin.stats` reads (a few KB per topic partition)
MAX_STATS_BYTES = 8 << 20
#: the most JSON values (counted as commas, colons, objects and arrays) a ``/stats`` answer may
#: hold: each costs up to ~80 bytes once parsed, so 500,000 stay under 40 MiB (a fork nsqd's
#: answer without clients holds ~350 values per topic partition)
MAX_STATS_VALUES = 500_000
#: the largest answer to the other calls read (nsqd answers them ``OK`` or a short error)
MAX_REPLY_BYTES = 64 << 10
_NARROW = "ask for one topic (topic=) or leave the clients out (clients=False)"
#: the fork's answer to ``/channel/setoffset`` (any position but the end) on a partition whose
#: commit log holds no message (HTTP 500)
_EMPTY_LOG = "commit log end of file"


class AdminError(DiscoveryError):
    """nsqlookupd or nsqd refused an admin request (or was unreachable), or it did not take
    effect in time."""


class PartitionEmptyError(AdminError):
    """:meth:`NsqdAdmin.set_offset` into a partition that never had a message (the fork answers
    ``commit log end of file``): nothing moved, and nothing needs to, since an empty partition
    is already at every position. Callers that seek every partition count it as done."""


def seek_position(
    *,
    offset: int | None = None,
    timestamp: float | None = None,
    count: int | None = None,
    end: bool = False,
) -> str:
    """The ``/channel/setoffset`` body for exactly one position: ``offset`` (queue byte offset),
    ``timestamp`` (Unix seconds), ``count`` (the N-th message, from 1) or ``end=True``; anything
    else is a :class:`ConfigError`."""
    chosen = [x for x in (offset, timestamp, count) if x is not None] + ([True] if end else [])
    if len(chosen) != 1:
        raise ConfigError("seek needs exactly one of offset=, timestamp=, count= or end=True")
    if offset is not None:
        return f"virtual_queue:{_whole(offset, 'offset', 0)}"
    if timestamp is not None:
        return f"timestamp:{int(seconds(timestamp, 'timestamp', zero=True))}"
    if count is not None:
        return f"msgcount:{_whole(count, 'count', 1)}"
    return "special:-1"


def _whole(value: object, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


class NsqdAdmin:
    """nsqd's HTTP admin calls on one node (``http_url``, e.g. a lookup NodeInfo's).

    Give ``http`` to share a client (it is then not closed here). Every refusal, and an
    unreachable nsqd, is an :class:`AdminError` naming the call; a call that does not end
    within ``timeout`` seconds, an :class:`~nsq_ha.errors.NsqTimeoutError`.
    """

    def __init__(
        self,
        http_url: str,
        *,
        http: httpx.AsyncClient | None = None,
        timeout: float = ADMIN_TIMEOUT,
    ) -> None:
        """Admin calls to the nsqd at ``http_url``, each within ``timeout`` seconds (also with
        a shared ``http`` client); a bad ``timeout`` is a :class:`ConfigError`."""
        import httpx

        #: the deadline of each call, in seconds
        self.timeout = seconds(timeout, "timeout")
        self.http_url = http_url.rstrip("/")
        self._owns_http = http is None
        self._http = (
            http
            if http is not None
            else httpx.AsyncClient(timeout=self.timeout, verify=tls_context())
        )

    def __repr__(self) -> str:
        return f"<NsqdAdmin {self.http_url}>"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP client if this object made it."""
        if self._owns_http:
            await self._http.aclose()

    # -- channels ---------------------------------------------------------------------------

    async def create_channel(self, topic: str, channel: str, partition: int | None = None) -> None:
        """``POST /channel/create`` (on the fork: on the partition's leader)."""
        await self._channel_post("/channel/create", topic, channel, partition)

    async def delete_channel(self, topic: str, channel: str, partition: int | None = None) -> None:
        """``POST /channel/delete``."""
        await self._channel_post("/channel/delete", topic, channel, partition)

    async def empty_channel(self, topic: str, channel: str, partition: int | None = None) -> None:
        """``POST /channel/empty``: drop what the channel has not delivered yet (the fork moves
        its cursor to the partition's end and clears its delayed messages)."""
        await self._channel_post("/channel/empty", topic, channel, partition)

    async def pause_channel(
        self, topic: str, channel: str, partition: int | None = None, *, paused: bool = True
    ) -> None:
        """``POST /channel/pause`` (``paused=False``: ``/channel/unpause``): stop (resume)
        delivering to the channel's consumers; messages keep accumulating."""
        path = "/channel/pause" if paused else "/channel/unpause"
        await self._channel_post(path, topic, channel, partition)

    async def set_offset(self, topic: str, channel: str, partition: int, position: str) -> None:
        """``POST /channel/setoffset`` on the partition's leader (the fork): move ``channel``
        to ``position`` (see :func:`seek_position`). A partition that never had a message
        raises :class:`PartitionEmptyError` (it is at every position already)."""
        try:
            await self._channel_post("/channel/setoffset", topic, channel, partition, position)
        except AdminError as exc:
            if _EMPTY_LOG not in str(exc):
                raise
            raise PartitionEmptyError(
                f"{topic}/{partition} has no message yet: channel {channel!r} is already at any "
                f"position (nsqd {self.http_url} answered {_EMPTY_LOG!r} to {position!r})"
            ) from exc

    async def set_order(
        self, topic: str, channel: str, partition: int | None, *, ordered: bool
    ) -> None:
        """``POST /channel/setorder`` (the fork): switch the channel's ordered mode."""
        await self._channel_post(
            "/channel/setorder",
            topic,
            channel,
            partition,
            extra={"order": "true" if ordered else "false"},
        )

    # -- topics -----------------------------------------------------------------------------

    async def delete_topic(self, topic: str) -> None:
        """``POST /topic/delete`` (vanilla nsqd: the topic, its channels and its data)."""
        await self._post("/topic/delete", {"topic": topic}, topic)

    async def topic_stats(self, topic: str, partition: int | None = None) -> list[dict[str, Any]]:
        """``GET /stats?format=json&topic=T[&partition=P]`` (v1, unwrapped: §5.1): the entries of
        ``topics`` (one per partition this nsqd holds; an empty list when it holds none)."""
        return await self.stats(topic, partition)

    async def stats(
        self,
        topic: str | None = None,
        partition: int | None = None,
        *,
        channel: str | None = None,
        clients: bool = True,
    ) -> list[dict[str, Any]]:
        """``GET /stats?format=json[&topic=T][&partition=P][&channel=C]``: the entries of
        ``topics`` (every topic partition the node holds when ``topic`` is None); ``clients``
        False leaves the consumers' connections out. An answer over :data:`MAX_STATS_BYTES`
        or :data:`MAX_STATS_VALUES` is refused (:class:`AdminError`)."""
        params = {"format": "json"}
        if topic is not None:
            params["topic"] = topic
        if partition is not None:
            params["partition"] = str(partition)
        if channel is not None:
            params["channel"] = channel
        if not clients:
            params["needClients"] = "false"  # the fork's name
            params["include_clients"] = "false"  # vanilla's
        async with self._within("/stats"):
            text = await self._stats_text(params, topic)
            try:
                data = await parse_json(text)
            except ValueError as exc:
                raise AdminError(f"nsqd {self.http_url} /stats is not JSON: {exc}") from None
            del text
        if isinstance(data, dict) and "topics" not in data and isinstance(data.get("data"), dict):
            data = data["data"]  # an nsqd that ignores the Accept header (the wrapped form)
        topics = data.get("topics") if isinstance(data, dict) else None
        if topics is not None and not isinstance(topics, list):
            raise AdminError(f"nsqd {self.http_url} /stats: 'topics' is not a list")
        return [t for t in topics or () if isinstance(t, dict)]

    # -- HTTP -------------------------------------------------------------------------------

    async def _channel_post(
        self,
        path: str,
        topic: str,
        channel: str,
        partition: int | None,
        body: str = "",
        *,
        extra: dict[str, str] | None = None,
    ) -> None:
        params = {"topic": topic, "channel": channel, **(extra or {})}
        if partition is not None:
            params["partition"] = str(partition)
        where = f"{topic}/{'-' if partition is None else partition}/{channel}"
        await self._post(path, params, where, body)

    def _within(self, what: str) -> contextlib.AbstractAsyncContextManager[None]:
        return within(
            self.timeout,
            f"nsqd {self.http_url} did not answer {what} within {self.timeout:g} s: raise the "
            "timeout (timeout=, nsq-ha --timeout), or check that the address is nsqd's HTTP port",
        )

    async def _stats_text(self, params: dict[str, str], topic: str | None) -> str:
        """The ``/stats`` answer as text, under both caps (the bytes are let go on return)."""
        import httpx

        url = f"{self.http_url}/stats"
        where = f"nsqd {self.http_url} /stats"
        try:
            answer = await fetch(
                self._http,
                "GET",
                url,
                where=where,
                max_bytes=MAX_STATS_BYTES,
                limit_name="MAX_STATS_BYTES",
                params=params,
                headers=V1_ACCEPT,
            )
        except httpx.HTTPError as exc:
            raise AdminError(f"nsqd {self.http_url} unreachable: {exc!r}") from exc
        except RemoteProtocolError as exc:
            raise AdminError(f"{exc}; {_NARROW}") from exc
        body = answer.body
        if answer.status != 200:
            raise AdminError(
                f"nsqd {self.http_url} refused /stats for {topic or 'all topics'}: "
                f"HTTP {answer.status} {body[:200].decode('utf-8', 'replace')}"
            )
        values = sum(body.count(c) for c in (b",", b":", b"{", b"["))
        if values > MAX_STATS_VALUES:
            raise AdminError(
                f"{where} answered {len(body)} bytes holding about {values} JSON values, over "
                f"the limit of {MAX_STATS_VALUES} values (MAX_STATS_VALUES); {_NARROW}"
            )
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise AdminError(f"{where} is not UTF-8 JSON: {exc}") from None

    async def _post(self, path: str, params: dict[str, str], where: str, body: str = "") -> None:
        import httpx

        url = f"{self.http_url}{path}"
        async with self._within(path):
            try:
                answer = await fetch(
                    self._http,
                    "POST",
                    url,
                    where=f"nsqd {self.http_url}{path}",
                    max_bytes=MAX_REPLY_BYTES,
                    limit_name="MAX_REPLY_BYTES",
                    params=params,
                    content=body.encode(),
                )
            except httpx.HTTPError as exc:
                raise AdminError(f"nsqd {self.http_url} unreachable: {exc!r}") from exc
            except RemoteProtocolError as exc:
                raise AdminError(str(exc)) from exc
        if answer.status != 200:
            what = f"{path} {body!r}" if body else path
            text = answer.body[:200].decode("utf-8", "replace")
            raise AdminError(
                f"nsqd {self.http_url} refused {what} for {where}: HTTP {answer.status} {text}"
            )
