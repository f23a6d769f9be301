"""The source's rows: :data:`SCHEMA`, and a consumed message as a row of it (the driver source
hands Spark these tuples; range reads build Arrow batches of the same columns,
:mod:`.source.arrow`). The sink writes a keyed row's key as :data:`KEY_HEADER`, where a read
finds it: both sides use this module."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

__all__ = [
    "KEY_HEADER",
    "SCHEMA",
    "RowFormat",
    "ext_and_key",
    "ext_fields",
    "message_row",
    "signed64",
]

#: the rows of the streaming source (Kafka's, with NSQ's fields)
SCHEMA = (
    "topic string, partition int, offset long, raw_size long, id string, trace_id long, "
    "attempts int, timestamp timestamp, ext string, key string, body binary, "
    "headers map<string,string>"
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
    text, key, _ = ext_fields(ext_data, b"", RowFormat(key_header=key_header))
    return text, key


def ext_fields(
    ext_data: bytes | None, body: bytes, fmt: RowFormat
) -> tuple[str | None, str | None, dict[str, str] | None]:
    """A message's ``ext``, ``key`` and ``headers`` columns.

    ``headers`` is the ext header's JSON object as a map of strings (a value that is not a
    string is kept as its JSON text), ``None`` without one. ``key`` is the header's
    ``fmt.key_header`` field; failing that, with ``fmt.key_body_field``, that field of a body
    that is a JSON object (a number is kept as its text); else ``None``."""
    text: str | None = None
    key: str | None = None
    headers: dict[str, str] | None = None
    if ext_data:
        text = ext_data.decode("utf-8", "replace")
        parsed: Any = None
        with contextlib.suppress(ValueError):
            parsed = json.loads(text)
        if isinstance(parsed, dict):
            headers = {
                str(k): v if isinstance(v, str) else json.dumps(v) for k, v in parsed.items()
            }
            value = parsed.get(fmt.key_header)
            if isinstance(value, str):
                key = value
    if key is None and fmt.key_body_field is not None and body[:1] == b"{":
        key = _body_key(body, fmt.key_body_field)
    return text, key, headers


def _body_key(body: bytes, name: str) -> str | None:
    try:
        parsed = json.loads(body)
    except ValueError:  # not JSON (or not UTF-8): no key
        return None
    value = parsed.get(name) if isinstance(parsed, dict) else None
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return json.dumps(value)
    return None


def message_row(topic: str, message: Any, fmt: RowFormat | None = None) -> tuple[Any, ...]:
    """One consumed message as a row of :data:`SCHEMA`."""
    body = bytes(message.body)
    ext_text, key, headers = ext_fields(message.ext_data, body, fmt or _PLAIN)
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
        body,
        headers,
    )
