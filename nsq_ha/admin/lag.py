"""A channel's lag from nsqd's ``/stats`` (pure: no I/O), the one copy that ``nsq-ha stats``
and :mod:`nsq_ha.otel` both use.

The fork keeps a confirmed offset per channel and partition: its lag is what the channel has not
confirmed, ``depth`` messages and ``depth_size`` bytes behind the partition's end, read from the
partition's leader (the ``/stats`` entry with ``is_leader``). Vanilla nsqd has no offsets: a
channel's lag there is its unfinished messages (``depth`` + in flight + deferred, as the fork
counts them) and the bytes are unknown (None).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ChannelLag", "channel_lag", "entry_lag", "is_fork_entry", "stat_int"]


@dataclass(frozen=True, slots=True)
class ChannelLag:
    """How far a channel is behind: ``messages`` and ``bytes`` (None where unknown)."""

    messages: int | None
    bytes: int | None


def stat_int(value: object) -> int | None:
    """A ``/stats`` number as an int (nsqd writes some as strings); None if it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return None


def is_fork_entry(entry: Mapping[str, Any]) -> bool:
    """True for a ``/stats`` topic entry of the fork (one partition: ``topic_partition``)."""
    return "topic_partition" in entry


def channel_lag(channel: Mapping[str, Any], *, fork: bool) -> ChannelLag:
    """The lag of one channel object of a ``/stats`` topic entry (``fork``: of the fork's)."""
    depth = stat_int(channel.get("depth"))
    if fork:
        return ChannelLag(depth, stat_int(channel.get("depth_size")))
    parts = (
        depth,
        stat_int(channel.get("in_flight_count")),
        stat_int(channel.get("deferred_count")),
    )
    return ChannelLag(None if None in parts else sum(p or 0 for p in parts), None)


def entry_lag(entry: Mapping[str, Any], channel: str) -> ChannelLag | None:
    """The lag of ``channel`` in one ``/stats`` topic entry; None when the entry has no such
    channel (or is not a partition's leader on the fork: only the leader's numbers count)."""
    fork = is_fork_entry(entry)
    if fork and not bool(entry.get("is_leader", True)):
        return None
    for found in entry.get("channels") or ():
        if isinstance(found, dict) and found.get("channel_name") == channel:
            return channel_lag(found, fork=fork)
    return None
