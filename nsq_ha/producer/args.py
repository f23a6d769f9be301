"""Checks of the producer's arguments that need no state (raise ConfigError, send nothing)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar, cast

from nsq_ha.errors import ConfigError
from nsq_ha.lookup import NodeInfo

_T = TypeVar("_T")


def sequence_of(values: Sequence[_T], what: str) -> list[_T]:
    """``values`` as a list if it is a sequence (list, tuple, ...), else ConfigError."""
    if isinstance(cast(object, values), str | bytes | bytearray | memoryview):
        raise ConfigError(f"publish_many takes a sequence of {what}, not one value")
    if not isinstance(cast(object, values), Sequence):
        raise ConfigError(
            f"publish_many takes a sequence (a list or tuple) of {what}, "
            f"not a {type(values).__name__}"
        )
    return list(values)


def per_message(values: Sequence[_T] | None, count: int, what: str) -> list[_T | None]:
    """One value per body (all None when ``values`` is None), or ConfigError."""
    if values is None:
        return [None] * count
    checked: list[_T | None] = list(sequence_of(values, what))
    if len(checked) != count:
        raise ConfigError(f"{what} has {len(checked)} entries for {count} bodies")
    return checked


def static_node(address: str) -> NodeInfo:
    """An ``nsqd=`` address (``host:port``) as a node."""
    host, sep, port = address.strip().rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ConfigError(f"nsqd address {address!r} is not host:port")
    return NodeInfo(broadcast_address=host.strip("[]"), tcp_port=int(port), http_port=0)
