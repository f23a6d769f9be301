"""The source's rows: :data:`SCHEMA`, and a consumed message as a row of it (the driver source
hands Spark these tuples; range reads build Arrow batches of the same columns, :mod:`.arrow`)."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

__all__ = ["KEY_HEADER", "SCHEMA", "RowFormat", "ext_and_key", "message_row", "signed64"]

#: the rows of the streaming source (Kafka's, with NSQ's fields)
SCHEMA = (
    "topic string, partition int, offset long, raw_size long, id string, trace_id long, "
    "attempts int, timestamp timestamp, ext string, key string, body binary"
)
#: the ext header key a sink row's key is written under (ext topics), read back as ``key``
KEY_HEADER = "nsq_key"


@dataclass(frozen=True, slots=True)
class RowFormat:
    """Where a source row's ``key`` comes from (options ``keyHeader``, ``keyBodyField``)."""

    #: the ext header field holding the key (ext topics)
    key_header: str = KEY_HEADER
    #: a field of a JSON object body holding the key (messages without one in the ext header)
    key_body_field: str | None = None


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_PLAIN = RowFormat()


def signed64(value: int | None) -> int | None:
    """A u64 trace id as Java's long (the fork's Java SDK shows it so)."""
    if value is None:
        return None
    return value - 2**64 if value >= 2**63 else value


def ext_and_key(
    ext_data: bytes | None, key_header: str = KEY_HEADER
) -> tuple[str | None, str | None]:
    """The ext header as text, and the key stored in it under ``key_header`` (a sink stores
    it under :data:`KEY_HEADER`; ``None`` where absent)."""
    if not ext_data:
        return None, None
    text = ext_data.decode("utf-8", "replace")
    key = None
    with contextlib.suppress(ValueError):
        parsed = json.loads(text)
        if isinstance(parsed, dict) and isinstance(parsed.get(key_header), str):
            key = parsed[key_header]
    return text, key


def message_row(topic: str, message: Any, fmt: RowFormat | None = None) -> tuple[Any, ...]:
    """One consumed message as a row of :data:`SCHEMA`."""
    ext_text, key = ext_and_key(message.ext_data, (fmt or _PLAIN).key_header)
    ts_ns: int = message.timestamp
    return (
        topic,
        message.partition,
        message.offset,
        message.raw_size,
        bytes(message.id).hex(),
        signed64(message.trace_id),
        message.attempts,
        _EPOCH + timedelta(microseconds=ts_ns // 1000),  # Spark keeps microseconds
        ext_text,
        key,
        bytes(message.body),
    )
