"""Moving a channel's read position on the fork: ``POST /channel/setoffset`` on the leader."""

from __future__ import annotations

import httpx

from nsq_ha.consumer.checks import check_count
from nsq_ha.durations import seconds
from nsq_ha.errors import ConfigError, NsqConnectionError, NsqError
from nsq_ha.lookup import NodeInfo

__all__ = ["seek_position", "set_offset"]


def seek_position(
    *, offset: int | None, timestamp: float | None, count: int | None, end: bool
) -> str:
    """The setoffset body for exactly one of the positions (checked: ConfigError)."""
    chosen = [x for x in (offset, timestamp, count) if x is not None] + ([True] if end else [])
    if len(chosen) != 1:
        raise ConfigError("seek needs exactly one of offset=, timestamp=, count= or end=True")
    if offset is not None:
        return f"virtual_queue:{check_count(offset, 'offset', 0)}"
    if timestamp is not None:
        return f"timestamp:{int(seconds(timestamp, 'timestamp', zero=True))}"
    if count is not None:
        return f"msgcount:{check_count(count, 'count', 1)}"
    return "special:-1"


async def set_offset(node: NodeInfo, topic: str, partition: int, channel: str, body: str) -> None:
    """Ask ``node`` (the partition's leader) to move ``channel`` to ``body``'s position."""
    url = f"{node.http_url}/channel/setoffset"
    params = {"topic": topic, "partition": str(partition), "channel": channel}
    async with httpx.AsyncClient(timeout=10.0) as http:
        try:
            response = await http.post(url, params=params, content=body.encode())
        except httpx.HTTPError as exc:
            raise NsqConnectionError(f"setoffset on {url} failed: {exc}") from exc
    if response.status_code != 200:
        raise NsqError(
            f"nsqd {node.http_url} refused setoffset {body!r} for "
            f"{topic}/{partition}/{channel}: HTTP {response.status_code} {response.text[:200]}"
        )
