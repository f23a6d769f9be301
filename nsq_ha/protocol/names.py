"""Topic, channel, partition and message-id rules shared by both servers (§0, §2.0.3, §4.1);
every check raises an :class:`~nsq_ha.errors.InvalidArgumentError` subclass."""

from __future__ import annotations

import functools
import re

from nsq_ha.errors import InvalidArgumentError, InvalidNameError

#: Longest topic or channel name, in bytes (the ``#ephemeral`` suffix included).
MAX_NAME_LENGTH = 64
#: Highest partition id nsqd and nsqlookupd accept.
MAX_PARTITION = 254
#: Explicit "let nsqd choose" partition token; same effect as sending no partition token.
DEFAULT_PARTITION = -1
#: Message ids are 16 opaque bytes on both servers.
MESSAGE_ID_LENGTH = 16

_NAME_RE = re.compile(r"[.a-zA-Z0-9_-]+(?:#ephemeral)?")


@functools.lru_cache(maxsize=4096)  # the embedded broker checks the names of every command
def is_valid_name(name: str) -> bool:
    """Return True when ``name`` is a valid topic or channel name."""
    return 1 <= len(name) <= MAX_NAME_LENGTH and _NAME_RE.fullmatch(name) is not None


def _validate_name(kind: str, name: object) -> str:
    if not isinstance(name, str):
        raise InvalidNameError(f"{kind} name must be a str, not {type(name).__name__}")
    if not is_valid_name(name):
        raise InvalidNameError(
            f"{kind} name {name!r} is not valid: 1..{MAX_NAME_LENGTH} characters "
            "from [.a-zA-Z0-9_-], optionally ending in '#ephemeral'"
        )
    return name


def validate_topic(topic: object) -> str:
    """Return ``topic`` if it is a valid topic name, else raise InvalidNameError."""
    return _validate_name("topic", topic)


def validate_channel(channel: object) -> str:
    """Return ``channel`` if it is a valid channel name, else raise InvalidNameError."""
    return _validate_name("channel", channel)


def validate_partition(partition: object) -> int | None:
    """Return ``partition`` if it is ``None`` (no partition token), ``-1`` (a token nsqd treats
    the same way: its default partition for the topic) or ``0..254``, else raise."""
    if partition is None:
        return None
    if isinstance(partition, bool) or not isinstance(partition, int):
        raise InvalidArgumentError(
            f"partition must be an int or None, not {type(partition).__name__}"
        )
    if partition != DEFAULT_PARTITION and not 0 <= partition <= MAX_PARTITION:
        raise InvalidArgumentError(
            f"partition {partition} is out of range: use 0..{MAX_PARTITION}, "
            f"{DEFAULT_PARTITION} or None"
        )
    return partition


def validate_message_id(message_id: object) -> bytes:
    """Return ``message_id`` as bytes if nsqd could accept it in FIN/REQ/TOUCH, else raise: 16
    bytes whose first 8, a signed big-endian integer, are above 0 (nsqd fatally rejects others;
    no real id looks like that: fork ids start at 1, vanilla ids are ASCII hex)."""
    if not isinstance(message_id, bytes | bytearray | memoryview):
        raise InvalidArgumentError(f"message id must be bytes, not {type(message_id).__name__}")
    raw = bytes(message_id)
    if len(raw) != MESSAGE_ID_LENGTH:
        raise InvalidArgumentError(f"message id must be {MESSAGE_ID_LENGTH} bytes, got {len(raw)}")
    if int.from_bytes(raw[:8], "big", signed=True) <= 0:
        raise InvalidArgumentError(f"message id {raw.hex()} is not valid: internal id <= 0")
    return raw
