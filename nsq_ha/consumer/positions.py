"""Where a consumer's channel starts (``start=``) and moves to (:meth:`Consumer.seek`).

Why not SUB_ADVANCED's start token (PROTOCOL.md §2.3.1): nsqd applies it whenever the
subscriber is the channel's only client, which a restarted consumer is (it would rewind its
group); with a partition the line has 5 tokens, and nsqd then ignores the partition; an ordered
topic refuses SUB_ADVANCED; and on a partition without a message it fails the SUB.

:mod:`nsq_ha.admin` loads only with the first position applied or seek (:func:`nsqd_admin`,
:func:`seek_body`).
"""

from __future__ import annotations

import asyncio
import logging
import numbers
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Literal, TypeAlias

from nsq_ha.consumer.checks import check_count
from nsq_ha.durations import seconds
from nsq_ha.errors import ConfigError, NotLeaderError, NsqError, UnsupportedByServerError
from nsq_ha.lookup import NodeInfo, PartitionMap
from nsq_ha.lookup.http import ADMIN_TIMEOUT

if TYPE_CHECKING:
    from nsq_ha.admin import NsqdAdmin


log = logging.getLogger(__name__)

#: what ``start=`` accepts (:class:`~nsq_ha.consumer.ConsumerConfig` says what each means)
StartPosition: TypeAlias = Literal["earliest", "latest"] | float | datetime | Mapping[int, int]
#: a checked ``start``: ``"earliest"``, ``"latest"``, float Unix seconds, or a dict
Start: TypeAlias = str | float | dict[int, int]

#: the largest queue offset nsqd can hold (int64)
_MAX_OFFSET = 2**63 - 1
#: what the fork answers a seek into a partition that never had a message
_EMPTY_LOG = "commit log end of file"
_NOT_LEADER = "E_FAILED_ON_NOT_LEADER"


def check_start(value: object) -> Start | None:
    """``start=`` checked and normalized, or :class:`ConfigError` saying what is accepted."""
    if value is None:
        return None
    if isinstance(value, str) and value in ("earliest", "latest"):
        return value
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ConfigError(
                f"start={value!r} has no tzinfo: give an aware datetime "
                "(datetime(..., tzinfo=UTC)) or Unix seconds"
            )
        return seconds(value.timestamp(), "start (a time)", zero=True)
    if isinstance(value, numbers.Real):  # seconds() refuses bools, NaN, infinities, < 0
        return seconds(value, "start (Unix seconds)", zero=True)
    if not isinstance(value, Mapping):
        raise ConfigError(
            "start must be 'earliest', 'latest', Unix seconds, an aware datetime or "
            f"{{partition: offset}}, got {type(value).__name__} {value!r:.60}"
        )
    offsets: dict[int, int] = {}
    for partition, offset in value.items():
        check_count(partition, "start: a partition", 0)
        check_count(offset, f"start: partition {partition}'s offset", 0)
        if offset > _MAX_OFFSET:
            raise ConfigError(
                f"start: partition {partition}'s offset must be at most 2**63-1, got {offset}"
            )
        offsets[partition] = offset
    if not offsets:
        raise ConfigError("start={} names no partition: give {partition: offset, ...} or None")
    return offsets


def nsqd_admin(url: str) -> NsqdAdmin:
    """The HTTP client of the nsqd at ``url`` for a start or a seek."""
    from nsq_ha.admin import NsqdAdmin

    return NsqdAdmin(url, timeout=ADMIN_TIMEOUT)


def seek_body(
    *,
    offset: int | None = None,
    timestamp: float | None = None,
    count: int | None = None,
    end: bool = False,
) -> str:
    """:func:`nsq_ha.admin.seek_position`: the ``/channel/setoffset`` body of a position."""
    from nsq_ha.admin import seek_position

    return seek_position(offset=offset, timestamp=timestamp, count=count, end=end)


def start_body(start: StartPosition | None, partition: int) -> str | None:
    """The ``/channel/setoffset`` body a new channel's ``partition`` moves to (``None``: stays)."""
    if start is None or start == "latest":
        return None
    if start == "earliest":
        return seek_body(offset=0)
    if isinstance(start, Mapping):
        offset = start.get(partition)
        return None if offset is None else seek_body(offset=offset)
    if isinstance(start, float):
        return seek_body(timestamp=start)  # rounded down to the second
    raise ConfigError(f"start={start!r} was not checked (ConsumerConfig checks it)")


def refuse_on_vanilla(start: StartPosition | None, pmap: PartitionMap | None, channel: str) -> None:
    """Refuse a ``start`` vanilla nsqd cannot honour for ``channel`` (``pmap`` None: no topic)."""
    if start is None:
        return
    if not isinstance(start, str):
        what = "offsets" if isinstance(start, Mapping) else "a time"
        raise UnsupportedByServerError(
            f"start at {what} needs the fork: vanilla nsqd has no start position (the fork's "
            "/channel/setoffset); leave start= out"
        )
    channels = () if pmap is None else pmap.channels
    if channel in channels:
        return  # an existing channel keeps its position, on vanilla as on the fork
    others = sorted(c for c in channels if c != channel)
    if start == "earliest" and others:
        raise UnsupportedByServerError(
            f"start='earliest': vanilla nsqd gives a new channel only messages published after "
            f"it exists, and the topic already has channels {', '.join(others)}; read one of "
            "them, or leave start= out"
        )
    if start == "latest" and not others:
        raise UnsupportedByServerError(
            "start='latest': vanilla nsqd hands a topic's first channel everything the topic "
            "holds, and this topic has no channel yet; leave start= out"
        )


# -- moving channels (the fork) --------------------------------------------------------------


async def move(admin: NsqdAdmin, topic: str, channel: str, partition: int, body: str) -> None:
    """``/channel/setoffset``; an empty partition (:data:`_EMPTY_LOG`) is there already."""
    from nsq_ha.admin import AdminError

    try:
        await admin.set_offset(topic, channel, partition, body)
    except AdminError as exc:
        if _EMPTY_LOG not in str(exc):
            raise
        log.info("%s/%s partition %d is empty: already at %s", topic, channel, partition, body)


def retriable(exc: NsqError) -> NsqError:
    """``E_FAILED_ON_NOT_LEADER`` (no leader there yet) as the NotLeaderError retries wait out."""
    if _NOT_LEADER in str(exc) and not isinstance(exc, NotLeaderError):
        return NotLeaderError(_NOT_LEADER, f"({exc})")
    return exc


async def channel_exists(admin: NsqdAdmin, topic: str, channel: str, partition: int) -> bool:
    """True when the leader's ``/stats`` lists ``channel`` in ``partition``."""
    for entry in await admin.stats(topic, partition, channel=channel, clients=False):
        channels = entry.get("channels")
        if isinstance(channels, list) and any(
            isinstance(c, dict) and c.get("channel_name") == channel for c in channels
        ):
            return True
    return False


async def move_all(
    leaders: Mapping[int, NodeInfo], topic: str, channel: str, body: str
) -> list[int]:
    """Move ``channel`` to ``body`` on every partition of ``leaders`` at once: the partitions
    moved, or an :class:`AdminError` naming those moved and those that failed."""
    from nsq_ha.admin import AdminError

    async def one(partition: int, node: NodeInfo) -> None:
        async with nsqd_admin(node.http_url) as admin:
            await move(admin, topic, channel, partition, body)

    items = sorted(leaders.items())
    results = await asyncio.gather(*(one(p, n) for p, n in items), return_exceptions=True)
    moved = [p for (p, _), r in zip(items, results, strict=True) if r is None]
    failed = [(p, r) for (p, _), r in zip(items, results, strict=True) if r is not None]
    for _, result in failed:
        if not isinstance(result, Exception):
            raise result  # a cancellation, or KeyboardInterrupt: not a failed seek
    if failed:
        done = f"partitions {', '.join(map(str, moved))} moved" if moved else "none moved"
        reasons = "; ".join(f"partition {p}: {r}" for p, r in failed)
        again = ", ".join(str(p) for p, _ in failed)
        raise AdminError(
            f"seek of {topic}/{channel} to {body}: {done}; {reasons}. Seek those again "
            f"(seek(partition, ...) for {again})"
        ) from failed[0][1]
    return moved
