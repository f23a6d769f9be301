"""The producer's pure batching core: validation, batch forming, commands and results.

Sizes and offsets are PROTOCOL.md's numbers measured on nsqd 0.3.7-HA.1.13.0 (§2.16, §4.6).
"""

from __future__ import annotations

import json
import struct
from collections import deque

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsq_ha.errors import BodyTooLargeError, InvalidArgumentError, RemoteProtocolError
from nsq_ha.producer.batch import (
    batch_command,
    plain_size,
    prepare_batch,
    results_from_answer,
)
from nsq_ha.producer.message import (
    BatchBuilder,
    PublishResult,
    prepare_message,
    record_size,
)
from nsq_ha.protocol import TracedResponse
from nsq_ha.protocol.broker import encode_traced_response
from nsq_ha.protocol.command_decoder import ClientCommand, CommandDecoder
from nsq_ha.protocol.publish import Publish, PublishMessage


def queue_of(*messages: PublishMessage) -> deque[PublishMessage]:
    return deque(messages)


def msg(
    body: bytes = b"x", trace_id: int | None = None, ext: bytes | None = None
) -> PublishMessage:
    return PublishMessage(body, trace_id, ext)


def encode_batch(
    topic: str,
    partition: int | None,
    messages: list[PublishMessage],
    *,
    tracing: bool = False,
    max_msg_size: int | None = None,
    max_body_size: int | None = None,
) -> Publish:
    """The publish command the sender makes of ``messages``."""
    name = batch_command(messages, tracing=tracing)
    return Publish(name, topic, partition, messages, max_msg_size, max_body_size)


WHERE = ("t", 0, "n", 1)
Told = tuple[int | None, int | None, int | None, int | None]


def told(
    internal_id: int | None = None,
    trace_id: int | None = None,
    offset: int | None = None,
    raw_size: int | None = None,
) -> Told:
    return (internal_id, trace_id, offset, raw_size)


def told_by(
    answer: bytes, messages: list[PublishMessage], *, ext_topic: bool | None = None
) -> list[Told]:
    """What nsqd's answer told of each message, as the results give it."""
    results = results_from_answer(answer, messages, batch_command(messages), WHERE, ext_topic)
    assert all((r.topic, r.partition, r.address, r.attempts) == WHERE for r in results)
    return [(r.internal_id, r.trace_id, r.offset, r.raw_size) for r in results]


# -- prepare_message --------------------------------------------------------------------------


def test_prepare_refuses_empty_and_non_bytes_bodies() -> None:
    with pytest.raises(InvalidArgumentError, match="must not be empty"):
        prepare_message(b"")
    with pytest.raises(InvalidArgumentError, match="must be bytes"):
        prepare_message("text")


def test_a_str_body_is_refused_with_the_fix() -> None:
    with pytest.raises(InvalidArgumentError, match=r"not str: encode it: body\.encode\(\)"):
        prepare_message("text")
    with pytest.raises(InvalidArgumentError, match=r"body\.encode\(\)"):
        prepare_batch([b"ok", "text"])


def test_prepare_takes_bytes_like_bodies_as_bytes_and_refuses_the_rest() -> None:
    for body in (b"ab", bytearray(b"ab"), memoryview(b"ab")):
        prepared = prepare_message(body)
        assert type(prepared.body) is bytes
        assert prepared.body == b"ab"
    with pytest.raises(InvalidArgumentError, match="must be bytes, not int"):
        prepare_message(12)


def test_prepare_checks_the_size_nsqd_compares() -> None:
    assert prepare_message(b"x" * 10, max_msg_size=10).body == b"x" * 10
    with pytest.raises(BodyTooLargeError, match="11 bytes"):
        prepare_message(b"x" * 11, max_msg_size=10)
    # PUB_TRACE counts the 8-byte trace id, PUB_EXT the 2-byte length and the header
    with pytest.raises(BodyTooLargeError, match="8-byte trace id"):
        prepare_message(b"x" * 3, trace_id=1, max_msg_size=10)
    with pytest.raises(BodyTooLargeError, match="ext header"):
        prepare_message(b"x" * 3, ext={"k": "v"}, max_msg_size=10)


def test_prepare_validates_trace_ids_and_headers() -> None:
    with pytest.raises(InvalidArgumentError, match="trace id"):
        prepare_message(b"x", trace_id=-1)
    with pytest.raises(InvalidArgumentError, match="trace id"):
        prepare_message(b"x", trace_id=1 << 64)
    with pytest.raises(InvalidArgumentError, match="JSON object"):
        prepare_message(b"x", ext=b"[1]")
    with pytest.raises(InvalidArgumentError, match="decimal"):
        prepare_message(b"x", ext={"##trace_id": 5})


def test_trace_id_goes_into_the_header_like_the_fork_sdks_do() -> None:
    m = prepare_message(b"x", trace_id=99, ext={"k": "v"})
    assert json.loads(m.ext or b"") == {"k": "v", "##trace_id": "99"}
    assert m.trace_id == 99
    same = prepare_message(b"x", trace_id=99, ext=b'{"##trace_id":"99"}')
    assert same.ext == b'{"##trace_id":"99"}'
    with pytest.raises(InvalidArgumentError, match="conflicts"):
        prepare_message(b"x", trace_id=1, ext={"##trace_id": "2"})
    # a header that names a trace id makes the message traced
    assert prepare_message(b"x", ext={"##trace_id": "7"}).trace_id == 7


# -- commands ---------------------------------------------------------------------------------


def test_command_table() -> None:
    plain, traced, ext = msg(), msg(trace_id=3), msg(ext=b'{"a":"b"}')
    assert batch_command([plain]) == b"PUB"
    assert batch_command([plain], tracing=True) == b"PUB_TRACE"
    assert batch_command([traced]) == b"PUB_TRACE"
    assert batch_command([ext]) == b"PUB_EXT"
    assert batch_command([plain, plain]) == b"MPUB"
    assert batch_command([plain, traced]) == b"MPUB_TRACE"
    assert batch_command([plain, plain], tracing=True) == b"MPUB_TRACE"
    assert batch_command([traced, ext]) == b"MPUB_EXT"
    with pytest.raises(InvalidArgumentError):
        batch_command([])


def test_encode_batch_gives_the_wire_bytes_of_each_command() -> None:
    a, b = b"alpha", b"beta"
    header = b'{"k":"v"}'
    assert encode_batch("t", 1, [msg(a)]).encode() == b"PUB t 1\n\x00\x00\x00\x05alpha"
    assert (
        encode_batch("t", 1, [msg(a)], tracing=True).encode()
        == b"PUB_TRACE t 1\n\x00\x00\x00\r" + bytes(8) + b"alpha"
    )
    assert (
        encode_batch("t", 1, [msg(a, 9)]).encode()
        == b"PUB_TRACE t 1\n\x00\x00\x00\r" + bytes(7) + b"\talpha"
    )
    assert (
        encode_batch("t", None, [msg(a, ext=header)]).encode()
        == b'PUB_EXT t\n\x00\x00\x00\x10\x00\t{"k":"v"}alpha'
    )
    assert (
        encode_batch("t", 2, [msg(a), msg(b)]).encode()
        == b"MPUB t 2\n\x00\x00\x00\x15\x00\x00\x00\x02\x00\x00\x00\x05alpha\x00\x00\x00\x04beta"
    )
    assert encode_batch("t", 2, [msg(a, 5), msg(b)]).encode() == (
        b"MPUB_TRACE t 2\n\x00\x00\x00%\x00\x00\x00\x02"
        + b"\x00\x00\x00\r"
        + bytes(7)
        + b"\x05alpha"
        + b"\x00\x00\x00\x0c"
        + bytes(8)
        + b"beta"
    )
    assert encode_batch("t", 0, [msg(a, ext=header), msg(b)]).encode() == (
        b'MPUB_EXT t 0\n\x00\x00\x00"\x00\x00\x00\x02'
        + b'\x00\x00\x00\x10\x00\t{"k":"v"}alpha'
        + b"\x00\x00\x00\x06\x00\x00beta"
    )


def test_encode_batch_gives_the_typed_publish_the_session_takes() -> None:
    command = encode_batch("t", 1, [msg(b"a"), msg(b"b", 4)], max_msg_size=10, max_body_size=100)
    assert isinstance(command, Publish)
    assert (command.name, command.topic, command.partition) == (b"MPUB_TRACE", "t", 1)
    assert command.encode() == (
        b"MPUB_TRACE t 1\n\x00\x00\x00\x1e\x00\x00\x00\x02"
        + b"\x00\x00\x00\t"
        + bytes(8)
        + b"a"
        + b"\x00\x00\x00\t"
        + bytes(7)
        + b"\x04b"
    )


def test_a_tracing_producer_counts_the_trace_id_against_the_message_limit() -> None:
    """A plain body at the limit is 8 bytes over it once PUB_TRACE carries it."""
    command = encode_batch("t", 0, [msg(b"x" * 10)], tracing=True, max_msg_size=10)
    with pytest.raises(BodyTooLargeError, match=r"18 bytes.* 10"):
        command.encode()


def test_encoded_batches_decode_as_nsqd_would_read_them() -> None:
    data = encode_batch("topic", 3, [msg(b"one", 1), msg(b"two"), msg(b"three", 3)]).encode()
    _magic, command = CommandDecoder().feed(b"  V2" + data)
    assert isinstance(command, ClientCommand)
    assert command.name == b"MPUB_TRACE"
    assert command.params == (b"topic", b"3")
    assert command.body is not None
    count = struct.unpack(">I", command.body[:4])[0]
    assert count == 3


# -- batch forming ----------------------------------------------------------------------------


def test_builder_takes_everything_that_fits_in_order() -> None:
    builder = BatchBuilder(max_msg_size=100, max_body_size=1000, max_count=3)
    queue = queue_of(*(msg(bytes([65 + i])) for i in range(7)))
    sizes = []
    while queue:
        sizes.append([m.body for m in builder.take(queue)])
    assert sizes == [[b"A", b"B", b"C"], [b"D", b"E", b"F"], [b"G"]]
    assert builder.take(queue) == []


def test_builder_respects_the_body_limit_exactly() -> None:
    # each 10-byte body costs 14 bytes in an MPUB body, plus 4 for the count
    limit = batch_body_size(5, 50, 0, "plain")
    assert limit == 4 + 5 * 14
    builder = BatchBuilder(max_msg_size=100, max_body_size=limit)
    queue = queue_of(*(msg(b"x" * 10) for _ in range(8)))
    assert len(builder.take(queue)) == 5
    assert len(builder.take(queue)) == 3
    # tracing adds 8 bytes per message
    traced = BatchBuilder(max_msg_size=100, max_body_size=limit, tracing=True)
    queue = queue_of(*(msg(b"x" * 10) for _ in range(8)))
    assert len(traced.take(queue)) == 3


def test_builder_sends_a_header_alone_unless_the_topic_is_ext() -> None:
    header = b'{"a":"b"}'
    builder = BatchBuilder(max_msg_size=100, max_body_size=1000)
    queue = queue_of(msg(), msg(ext=header), msg(), msg())
    assert len(builder.take(queue)) == 1  # stops before the header
    assert [m.ext for m in builder.take(queue)] == [header]
    assert len(builder.take(queue)) == 2
    on_ext = BatchBuilder(max_msg_size=100, max_body_size=1000, ext_topic=True)
    queue = queue_of(msg(), msg(ext=header), msg())
    assert len(on_ext.take(queue)) == 3


def test_builder_stops_when_a_new_kind_would_push_a_message_over_max_msg_size() -> None:
    # a 95-byte plain body fits max_msg_size 100; in an MPUB_TRACE batch it would be 103
    builder = BatchBuilder(max_msg_size=100, max_body_size=10_000)
    queue = queue_of(msg(b"x" * 95), msg(b"y", trace_id=1))
    assert len(builder.take(queue)) == 1
    queue = queue_of(msg(b"y", trace_id=1), msg(b"x" * 95))
    assert len(builder.take(queue)) == 1


@given(
    st.lists(st.tuples(st.integers(1, 60), st.booleans(), st.booleans()), min_size=1, max_size=40),
    st.integers(100, 600),
    st.booleans(),
)
def test_every_batch_encodes_within_the_limits(
    spec: list[tuple[int, bool, bool]], body_limit: int, ext_topic: bool
) -> None:
    max_msg = 80
    messages = [
        msg(b"b" * size, trace_id=7 if traced else None, ext=b'{"k":1}' if ext else None)
        for size, traced, ext in spec
    ]
    builder = BatchBuilder(max_msg_size=max_msg, max_body_size=body_limit, ext_topic=ext_topic)
    queue = queue_of(*messages)
    seen: list[PublishMessage] = []
    while queue:
        batch = builder.take(queue)
        assert batch
        seen.extend(batch)
        if len(batch) > 1:  # a lone message is checked by prepare_message, not the builder
            encode_batch("t", 0, batch, max_msg_size=max_msg, max_body_size=body_limit).encode()
    assert seen == messages


# -- what nsqd answered -----------------------------------------------------------------------


def traced_answer(internal_id: int, trace_id: int, offset: int, raw_size: int) -> bytes:
    return encode_traced_response(TracedResponse(internal_id, trace_id, offset, raw_size))


def test_record_sizes_are_the_ones_nsqd_reported() -> None:
    assert record_size(msg(b"abcd"), ext_topic=False) == 34
    assert record_size(msg(b"abcd"), ext_topic=True) == 35
    header = b'{"##trace_id":"999","k":"v"}'
    assert len(header) == 28
    assert record_size(msg(b"x" * 5, ext=header), ext_topic=True) == 66


def test_plain_answers_tell_nothing_of_the_messages() -> None:
    assert told_by(b"OK", [msg(), msg()]) == [told(), told()]
    assert told_by(b"OK", [msg(ext=b'{"a":"b"}')]) == [told()]
    with pytest.raises(RemoteProtocolError, match="answered OK"):
        told_by(traced_answer(2, 0, 0, 31), [msg()])


def test_single_traced_answer_is_taken_as_it_is() -> None:
    answer = traced_answer(2, 0x1122334455667788, 0, 34)
    (result,) = results_from_answer(answer, [msg(b"abcd", 0x1122334455667788)], b"PUB_TRACE", WHERE)
    assert result == PublishResult(*WHERE, 2, 0x1122334455667788, 0, 34)
    assert result.message_id == struct.pack(">QQ", 2, 0x1122334455667788)
    assert PublishResult(*WHERE).message_id is None


def test_a_server_that_lies_about_a_traced_publish_is_caught() -> None:
    with pytest.raises(RemoteProtocolError, match="echoed trace id 8"):
        told_by(traced_answer(2, 8, 0, 34), [msg(b"abcd", 7)])
    with pytest.raises(RemoteProtocolError, match="traced response"):
        told_by(b"OK", [msg(b"abcd", 7)])
    with pytest.raises(RemoteProtocolError, match="trace id 5, not 0"):
        told_by(traced_answer(3, 5, 34, 69), [msg(b"abcd", 7), msg(b"abcde", 8)])


def test_mpub_trace_results_follow_from_the_record_layout() -> None:
    # §2.16: MPUB_TRACE of two messages (traces 7, 8; bodies 4 and 5 bytes) -> id 3, offset 34,
    # raw size 69 for the batch
    batch = [msg(b"abcd", 7), msg(b"abcde", 8)]
    receipts = told_by(traced_answer(3, 0, 34, 69), batch)
    assert receipts == [told(3, 7, 34, 34), told(4, 8, 68, 35)]
    # the same batch on an ext topic: one more byte per record
    ext_receipts = told_by(traced_answer(3, 0, 34, 71), batch, ext_topic=True)
    assert ext_receipts == [told(3, 7, 34, 35), told(4, 8, 69, 36)]
    # unknown topic kind: the layout whose sizes add up wins
    assert told_by(traced_answer(3, 0, 34, 71), batch) == ext_receipts
    # untraced messages in a traced batch were sent with trace id 0
    mixed = told_by(traced_answer(3, 0, 0, 65), [msg(b"abcd"), msg(b"a", 1)])
    assert [r[1] for r in mixed] == [0, 1]


def test_mpub_trace_sizes_that_add_up_to_nothing_known_keep_only_the_first(
    caplog: pytest.LogCaptureFixture,
) -> None:
    batch = [msg(b"abcd", 7), msg(b"abcde", 8)]
    receipts = told_by(traced_answer(3, 0, 34, 1000), batch)
    assert receipts == [told(3, 7, 34, None), told(None, 8, None, None)]
    assert "no known record layout" in caplog.text


# -- the plain fast paths agree with the general rules ----------------------------------------


def batch_body_size(bodies: int, body_bytes: int, ext_bytes: int, kind: str) -> int:
    """Size of an ``MPUB*`` body: count, then a length and the encoded message per message."""
    size = 4 + 4 * bodies + body_bytes
    if kind == "trace":
        size += 8 * bodies
    elif kind == "ext":
        size += 2 * bodies + ext_bytes
    return size


def _general_take(builder: BatchBuilder, queue: deque[PublishMessage]) -> list[PublishMessage]:
    """The general rule, one message at a time: the batch grows while its encoded body fits."""
    batch = [queue.popleft()]
    while queue and len(batch) < builder.max_count:
        candidate = [*batch, queue[0]]
        traced = builder.tracing or any(m.trace_id is not None for m in candidate)
        kind = "trace" if traced else "plain"
        if any(m.ext is not None for m in candidate):
            break
        size = batch_body_size(len(candidate), sum(len(m.body) for m in candidate), 0, kind)
        if size > builder.max_body_size:
            break
        batch.append(queue.popleft())
    return batch


@given(
    bodies=st.lists(st.integers(1, 40), min_size=1, max_size=60),
    traced_at=st.sets(st.integers(0, 59), max_size=5),
    max_body=st.integers(50, 400),
    max_count=st.integers(1, 20),
)
def test_take_cuts_where_the_general_rule_does(
    bodies: list[int], traced_at: set[int], max_body: int, max_count: int
) -> None:
    messages = [msg(b"x" * n, trace_id=7 if i in traced_at else None) for i, n in enumerate(bodies)]
    builder = BatchBuilder(max_msg_size=100, max_body_size=max_body, max_count=max_count)
    fast, slow = queue_of(*messages), queue_of(*messages)
    while fast:
        assert builder.take(fast) == _general_take(builder, slow)


@given(
    bodies=st.lists(
        st.one_of(st.binary(max_size=12), st.text(max_size=3), st.none()), min_size=1, max_size=8
    ),
    traced=st.booleans(),
    limit=st.integers(1, 10),
)
def test_prepare_batch_is_prepare_message_of_each(
    bodies: list[object], traced: bool, limit: int
) -> None:
    """The batch form refuses and returns exactly what the one-message form does, and what the
    plain ones add to an MPUB body is what plain_size sums for them."""
    traces = [7] * len(bodies) if traced else None

    def each() -> list[object]:
        return [
            prepare_message(b, trace_id=t, max_msg_size=limit)
            for b, t in zip(bodies, traces or [None] * len(bodies), strict=True)
        ]

    try:
        expected = each()
    except InvalidArgumentError as exc:
        with pytest.raises(type(exc)):
            prepare_batch(bodies, traces, None, max_msg_size=limit)
        return
    messages, plain_bytes = prepare_batch(bodies, traces, None, max_msg_size=limit)
    assert messages == expected
    plain = None if traced else sum(4 + len(m.body) for m in messages)
    assert plain_bytes == plain_size(messages) == plain
