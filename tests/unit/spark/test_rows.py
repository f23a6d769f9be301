"""The source's rows without Spark: a message as a row of the schema, as a tuple (driver source)
and as an Arrow batch (range reads), with the same values; ``headers`` as a map; where ``key``
comes from (an ext header field, or a field of a JSON body)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from nsq_ha.spark.options import parse_read_options
from nsq_ha.spark.rows import RowFormat, ext_fields, message_row

L = "http://127.0.0.1:4161"


class _Msg:
    partition = 2
    offset = 4096
    raw_size = 48
    id = bytes(range(16))
    trace_id = 2**64 - 1
    attempts = 1
    timestamp = 1_700_000_000_123_456_789
    ext_data = json.dumps({"nsq_key": "u7", "a": "b"}).encode()
    body = b"payload"


def _msg(ext: Any = None, body: bytes = b"payload") -> _Msg:
    message = _Msg()
    message.ext_data = (
        b"" if ext is None else ext if isinstance(ext, bytes) else json.dumps(ext).encode()
    )
    message.body = body
    return message


def test_message_row_matches_the_schema_order() -> None:
    row = message_row("t", _Msg())
    assert row[:5] == ("t", 2, 4096, 48, bytes(range(16)).hex())
    assert row[5] == -1  # u64 max as Java's long
    assert row[6] == 1
    assert row[7] == datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=UTC)  # us, truncated
    assert json.loads(row[8]) == {"nsq_key": "u7", "a": "b"}
    assert row[9:] == ("u7", b"payload", {"nsq_key": "u7", "a": "b"})


def _as_rows(batch: Any) -> list[tuple[Any, ...]]:
    """Arrow gives a map as a list of pairs: as the dict a tuple row holds."""
    rows = []
    for record in batch.to_pylist():
        values = list(record.values())
        values[11] = None if values[11] is None else dict(values[11])
        values[7] = values[7].astimezone(UTC)
        rows.append(tuple(values))
    return rows


@pytest.mark.parametrize(
    "fmt",
    [None, RowFormat(key_header="user"), RowFormat(key_body_field="user")],
    ids=["default", "key_header", "key_body_field"],
)
def test_the_arrow_rows_are_the_schema_and_the_values_of_message_row(fmt: RowFormat | None) -> None:
    pytest.importorskip("pyarrow", reason="the spark extra is not installed")
    from nsq_ha.spark.rows import SCHEMA
    from nsq_ha.spark.source.arrow import arrow_schema, record_batch, row_type

    ddl = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in row_type().fields)
    assert ddl == SCHEMA.replace("long", "bigint")
    messages = [
        _Msg(),
        _msg(),  # a message of a non-ext topic
        _msg({"user": "ann", "n": 3, "deep": {"x": [1]}}),
        _msg(None, b'{"user": 42}'),
        _msg(b"not json"),
    ]
    batch = record_batch("t", messages, arrow_schema(), fmt)
    assert batch.schema == arrow_schema()
    assert _as_rows(batch) == [message_row("t", m, fmt) for m in messages]


def test_headers_are_the_ext_object_as_strings_and_null_without_one() -> None:
    fmt = RowFormat()
    _, _, headers = ext_fields(b'{"a": "b", "n": 3, "f": null, "o": {"x": 1}}', b"x", fmt)
    assert headers == {"a": "b", "n": "3", "f": "null", "o": '{"x": 1}'}
    assert ext_fields(None, b"x", fmt) == (None, None, None)
    assert ext_fields(b"", b"x", fmt) == (None, None, None)
    # an ext header that is not a JSON object is kept as text, with no map
    assert ext_fields(b"[1, 2]", b"x", fmt) == ("[1, 2]", None, None)
    assert ext_fields(b"\xff{", b"x", fmt)[1:] == (None, None)


@pytest.mark.parametrize(
    ("ext", "body", "fmt", "key"),
    [
        ({"nsq_key": "k1"}, b"x", RowFormat(), "k1"),
        ({"nsq_key": 7}, b"x", RowFormat(), None),  # not a string: no key
        ({"user": "ann"}, b"x", RowFormat(key_header="user"), "ann"),
        ({"nsq_key": "k1"}, b"x", RowFormat(key_header="user"), None),
        # the body, only when asked and only when the header has no key
        (None, b'{"user": "bob"}', RowFormat(), None),
        (None, b'{"user": "bob"}', RowFormat(key_body_field="user"), "bob"),
        (None, b'{"user": 12}', RowFormat(key_body_field="user"), "12"),
        (None, b'{"user": 1.5}', RowFormat(key_body_field="user"), "1.5"),
        (None, b'{"user": true}', RowFormat(key_body_field="user"), None),
        (None, b'{"user": null}', RowFormat(key_body_field="user"), None),
        (None, b'{"other": "x"}', RowFormat(key_body_field="user"), None),
        (None, b'{"user": "bob"', RowFormat(key_body_field="user"), None),  # broken JSON
        (None, b'["user"]', RowFormat(key_body_field="user"), None),
        (None, b"\xff\xfe", RowFormat(key_body_field="user"), None),
        ({"nsq_key": "h"}, b'{"user": "b"}', RowFormat(key_body_field="user"), "h"),
        ({"a": "b"}, b'{"user": "b"}', RowFormat(key_body_field="user"), "b"),
    ],
)
def test_where_the_key_comes_from(ext: Any, body: bytes, fmt: RowFormat, key: str | None) -> None:
    ext_data = None if ext is None else json.dumps(ext).encode()
    assert ext_fields(ext_data, body, fmt)[1] == key
    assert message_row("t", _msg(ext, body), fmt)[9] == key


def test_key_options_reach_the_row_format() -> None:
    base = {"lookupd": L, "topic": "t"}
    assert parse_read_options(base).row_format == RowFormat()
    opts = parse_read_options({**base, "KEYHEADER": "user", "keyBodyField": "id"})
    assert opts.row_format == RowFormat(key_header="user", key_body_field="id")
