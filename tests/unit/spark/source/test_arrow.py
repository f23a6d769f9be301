"""A range read's messages as an Arrow batch: the column-at-once conversion of one partition's
plain messages gives exactly the batch of the message-by-message one, and messages it cannot
convert so (an ext header, a key taken from the body) go message by message."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

pytest.importorskip("pyarrow", reason="the spark extra is not installed")

from nsq_ha.consumer.message import Message
from nsq_ha.protocol.message import DecodedMessage
from nsq_ha.spark.rows import RowFormat, message_row
from nsq_ha.spark.source.arrow import arrow_schema, record_batch


@dataclass
class _Slot:
    """What a message needs of the consumer slot that delivered it."""

    topic: str = "orders"
    channel: str = "spark"
    partition: int | None = 3
    address: str = "127.0.0.1:4150"
    ordered: bool = False


def _messages(count: int, ext: dict[int, bytes] | None = None) -> list[Message]:
    slot = _Slot()
    made = []
    for i in range(count):
        decoded = DecodedMessage(
            timestamp=1_700_000_000_123_456_789 + i * 1_001,
            attempts=1 + i % 3,
            id=(i * 7919).to_bytes(8, "big") + (2**64 - 1 - i).to_bytes(8, "big"),
            body=b"body-%d" % i if i % 5 else b"",
            internal_id=i,
            trace_id=[0, 1, 2**63, 2**64 - 1][i % 4],
            ext_version=0,
            ext_data=(ext or {}).get(i, b""),
            offset=4096 + 57 * i,
            raw_size=57,
        )
        made.append(Message(decoded, slot))  # type: ignore[arg-type]
    return made


def test_one_partitions_plain_messages_give_the_batch_of_the_message_by_message_rows() -> None:
    messages = _messages(1000)
    schema = arrow_schema()
    by_columns = record_batch("orders", messages, schema, partition=3)
    one_by_one = record_batch("orders", messages, schema)
    assert by_columns.schema == schema
    assert by_columns.equals(one_by_one)
    first = by_columns.slice(0, 1).to_pylist()[0]
    assert tuple(first.values())[:7] == message_row("orders", messages[0])[:7]
    assert by_columns.column("trace_id").to_pylist()[:4] == [0, 1, -(2**63), -1]


def test_messages_with_an_ext_header_or_a_body_key_go_message_by_message() -> None:
    header = json.dumps({"nsq_key": "u7"}).encode()
    messages = _messages(10, ext={4: header})
    schema = arrow_schema()
    batch = record_batch("orders", messages, schema, partition=3)
    assert batch.equals(record_batch("orders", messages, schema))
    assert batch.column("key").to_pylist()[4] == "u7"
    body_key = RowFormat(key_body_field="user")
    plain = _messages(3)
    assert record_batch("orders", plain, schema, body_key, partition=3).equals(
        record_batch("orders", plain, schema, body_key)
    )
    assert record_batch("orders", [], schema, partition=3).num_rows == 0
