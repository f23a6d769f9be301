"""The publish commands: exact bytes, checks, and round trips through the server-side decoder."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsq_ha.errors import BodyTooLargeError, InvalidArgumentError
from nsq_ha.producer.batch import batch_command
from nsq_ha.producer.message import prepare_message
from nsq_ha.protocol import Dpub, Publish, PublishMessage, validate_partition, validate_topic
from nsq_ha.protocol.command_decoder import (
    ClientCommand,
    CommandDecoder,
    split_ext_message,
    split_mpub_body,
    split_trace_message,
)
from nsq_ha.protocol.identify import parse_identify_response
from nsq_ha.protocol.publish import ExtHeader, encode_ext_header
from nsq_ha.protocol.session import ClientSession

names = st.from_regex(r"[.a-zA-Z0-9_-]{1,64}", fullmatch=True)
partitions = st.one_of(st.none(), st.just(-1), st.integers(0, 254))
bodies = st.binary(min_size=1, max_size=64)
trace_ids = st.integers(0, (1 << 64) - 1)
headers = st.dictionaries(
    st.text(max_size=8).filter(lambda k: k != "##trace_id"),
    st.one_of(st.text(max_size=8), st.integers(), st.booleans(), st.none()),
    max_size=4,
)


def decode_one(data: bytes) -> ClientCommand:
    (command,) = CommandDecoder(expect_magic=False).feed(data)
    assert isinstance(command, ClientCommand)
    return command


def publish(
    name: bytes,
    topic: str,
    messages: list[PublishMessage],
    partition: int | None = None,
    **limits: int,
) -> bytes:
    """The bytes of one publish command."""
    return Publish(name, topic, partition, messages, **limits).encode()


def ext(body: bytes, header: ExtHeader | None) -> PublishMessage:
    """A message with a JSON header (``None``: an empty one, as MPUB_EXT allows)."""
    return PublishMessage(body, None, None if header is None else encode_ext_header(header))


def _tokens(topic: str, partition: int | None) -> tuple[bytes, ...]:
    return (topic.encode(),) + (() if partition is None else (str(partition).encode(),))


def test_exact_bytes_from_the_recordings() -> None:
    assert publish(b"PUB", "cf_pubsub", [PublishMessage(b"msg-1")], 0) == bytes.fromhex(
        "5055422063665f70756273756220300a000000056d73672d31"
    )
    assert publish(b"PUB", "cf_vps", [PublishMessage(b"v-1")]) == b"PUB cf_vps\n\x00\x00\x00\x03v-1"
    assert publish(b"PUB", "cf_pubsub", [PublishMessage(b"msg-minus1")], -1) == bytes.fromhex(
        "5055422063665f707562737562202d310a0000000a6d73672d6d696e757331"
    )
    mpub = publish(b"MPUB", "cf_pubsub", [PublishMessage(b"msg-2"), PublishMessage(b"msg-3")], 0)
    assert mpub == bytes.fromhex(
        "4d5055422063665f70756273756220300a0000001600000002000000056d73672d32000000056d73672d33"
    )
    traced = PublishMessage(b"tr-1", 0x1122334455667788)
    assert publish(b"PUB_TRACE", "cf_trace", [traced], 0) == bytes.fromhex(
        "5055425f54524143452063665f747261636520300a0000000c112233445566778874722d31"
    )
    batch = [PublishMessage(b"mt-1", 7), PublishMessage(b"mt-22", 8)]
    assert publish(b"MPUB_TRACE", "cf_trace", batch, 0) == bytes.fromhex(
        "4d5055425f54524143452063665f747261636520300a00000025000000020000000c000000000000"
        "00076d742d310000000d00000000000000086d742d3232"
    )
    pub_ext = publish(b"PUB_EXT", "cf_ext", [ext(b"ext-1", {"##trace_id": "999", "k": "v"})], 0)
    assert pub_ext == bytes.fromhex(
        "5055425f4558542063665f65787420300a00000023001c7b22232374726163655f6964223a22393939"
        "222c226b223a2276227d6578742d31"
    )
    ext_batch = [ext(b"mx-1", {"##trace_id": "5", "a": "b"}), ext(b"mx-2", None)]
    mpub_ext = publish(b"MPUB_EXT", "cf_ext", ext_batch, 0)
    assert mpub_ext == bytes.fromhex(
        "4d5055425f4558542063665f65787420300a000000320000000200000020001a7b22232374726163655f"
        "6964223a2235222c2261223a2262227d6d782d310000000600006d782d32"
    )
    assert Dpub("cf_vps", b"v-deferred", 1.0).encode() == bytes.fromhex(
        "445055422063665f76707320313030300a0000000a762d6465666572726564"
    )


def test_ext_header_bytes_are_sent_verbatim() -> None:
    raw = b'{ "k" : "v" }'
    assert publish(b"PUB_EXT", "t", [ext(b"b", raw)]).endswith(b"\x00\x0d" + raw + b"b")
    assert encode_ext_header({"é": "ü"}) == '{"é":"ü"}'.encode()
    assert encode_ext_header({}) == b"{}"
    assert encode_ext_header(bytearray(b"{}")) == b"{}"  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("header", "match"),
    [
        (b"", "not valid JSON"),
        (b'{"a":', "not valid JSON"),
        (b"\xff", "not valid JSON"),
        (b"[" * 100000, "not valid JSON"),
        (b"[1]", "JSON object"),
        ({"##trace_id": 5}, "decimal string"),
        ({"##trace_id": "abc"}, "decimal u64"),
        ({"##trace_id": "-1"}, "decimal u64"),
        ({"##trace_id": str(1 << 64)}, "decimal u64"),
        (b'{"##trace_id":5}', "decimal string"),
        ({"k": "x" * 65535}, "over the limit of 65534"),
        ({"k": object()}, "JSON"),
        ("{}", "must be bytes"),
    ],
)
def test_bad_ext_headers_are_refused(header: object, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        encode_ext_header(header)  # type: ignore[arg-type]


def test_trace_id_header_accepts_u64_strings() -> None:
    assert encode_ext_header({"##trace_id": str((1 << 64) - 1)})
    assert encode_ext_header({"##trace_id": "0"})


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: prepare_message(b""), "must not be empty"),
        (lambda: prepare_message("text"), "must be bytes"),
        (lambda: validate_topic("bad!topic"), "topic name"),
        (lambda: validate_partition(255), "partition"),
        (lambda: prepare_message(b"", trace_id=1), "must not be empty"),
        (lambda: prepare_message(b"x", trace_id=-1), "trace id"),
        (lambda: prepare_message(b"x", trace_id=1 << 64), "trace id"),
        (lambda: prepare_message(b"", ext={"a": 1}), "must not be empty"),
        (lambda: batch_command([]), "at least one message"),
        (lambda: batch_command([], tracing=True), "at least one message"),
        (lambda: Dpub("t", b"x", -1), "DPUB delay"),
    ],
)
def test_invalid_publish_arguments(call: object, match: str) -> None:
    """What a publish checks where it comes in: the producer's message and batch, the names,
    the DPUB delay."""
    with pytest.raises(InvalidArgumentError, match=match):
        call()  # type: ignore[operator]


def test_size_limits_name_size_and_limit() -> None:
    with pytest.raises(BodyTooLargeError, match="PUB body is 5 bytes, over the limit of 4 bytes"):
        publish(b"PUB", "t", [PublishMessage(b"12345")], max_msg_size=4)
    assert publish(b"PUB", "t", [PublishMessage(b"1234")], max_msg_size=4)
    with pytest.raises(BodyTooLargeError, match="with the 8-byte trace id\\) is 9 bytes"):
        publish(b"PUB_TRACE", "t", [PublishMessage(b"x", 1)], max_msg_size=8)
    with pytest.raises(BodyTooLargeError, match="with the JSON header\\) is 5 bytes"):
        publish(b"PUB_EXT", "t", [ext(b"x", b"{}")], max_msg_size=4)
    with pytest.raises(BodyTooLargeError, match="MPUB message 1 is 3 bytes"):
        publish(b"MPUB", "t", [PublishMessage(b"ab"), PublishMessage(b"abc")], max_msg_size=2)
    with pytest.raises(BodyTooLargeError, match="MPUB body is 16 bytes, over the limit of 15"):
        publish(b"MPUB", "t", [PublishMessage(b"ab"), PublishMessage(b"ab")], max_body_size=15)
    with pytest.raises(BodyTooLargeError, match="MPUB_TRACE message 0 is 9 bytes"):
        publish(b"MPUB_TRACE", "t", [PublishMessage(b"x", 1)], max_msg_size=8)
    with pytest.raises(BodyTooLargeError, match="MPUB_EXT body"):
        publish(b"MPUB_EXT", "t", [ext(b"x", None)], max_body_size=8)
    with pytest.raises(BodyTooLargeError, match="message body is 2 bytes"):  # a DPUB's too
        prepare_message(b"xx", max_msg_size=1)


@given(names, bodies, partitions)
def test_pub_round_trip(topic: str, body: bytes, partition: int | None) -> None:
    command = decode_one(publish(b"PUB", topic, [PublishMessage(body)], partition))
    assert command == ClientCommand(b"PUB", _tokens(topic, partition), body, len(body))


@given(names, bodies, trace_ids, partitions)
def test_pub_trace_round_trip(
    topic: str, body: bytes, trace_id: int, partition: int | None
) -> None:
    command = decode_one(publish(b"PUB_TRACE", topic, [PublishMessage(body, trace_id)], partition))
    assert (command.name, command.params) == (b"PUB_TRACE", _tokens(topic, partition))
    assert command.body is not None
    assert split_trace_message(command.body) == (trace_id, body)


@given(names, bodies, headers, partitions)
def test_pub_ext_round_trip(
    topic: str, body: bytes, header: dict[str, object], partition: int | None
) -> None:
    command = decode_one(publish(b"PUB_EXT", topic, [ext(body, header)], partition))
    assert (command.name, command.params) == (b"PUB_EXT", _tokens(topic, partition))
    assert command.body is not None
    raw_header, payload = split_ext_message(command.body)
    assert json.loads(raw_header) == header
    assert payload == body


@given(names, st.lists(bodies, min_size=1, max_size=8), partitions)
def test_mpub_round_trip(topic: str, batch: list[bytes], partition: int | None) -> None:
    command = decode_one(publish(b"MPUB", topic, [PublishMessage(b) for b in batch], partition))
    assert (command.name, command.params) == (b"MPUB", _tokens(topic, partition))
    assert command.body is not None
    assert split_mpub_body(command.body) == batch
    assert command.declared_size == len(command.body)


@given(names, st.lists(st.tuples(trace_ids, bodies), min_size=1, max_size=8), partitions)
def test_mpub_trace_round_trip(
    topic: str, batch: list[tuple[int, bytes]], partition: int | None
) -> None:
    messages = [PublishMessage(body, trace_id) for trace_id, body in batch]
    command = decode_one(publish(b"MPUB_TRACE", topic, messages, partition))
    assert command.body is not None
    assert [split_trace_message(m) for m in split_mpub_body(command.body)] == batch


@given(
    names,
    st.lists(st.tuples(st.one_of(st.none(), headers.filter(bool)), bodies), min_size=1, max_size=6),
    partitions,
)
def test_mpub_ext_round_trip(
    topic: str, batch: list[tuple[dict[str, object] | None, bytes]], partition: int | None
) -> None:
    command = decode_one(publish(b"MPUB_EXT", topic, [ext(b, h) for h, b in batch], partition))
    assert command.body is not None
    decoded = [split_ext_message(m) for m in split_mpub_body(command.body)]
    assert [(json.loads(h) if h else None, b) for h, b in decoded] == batch


@given(names, bodies, st.integers(0, 3_600_000))
def test_dpub_round_trip(topic: str, body: bytes, delay_ms: int) -> None:
    command = decode_one(Dpub(topic, body, delay_ms / 1000).encode())
    assert command == ClientCommand(
        b"DPUB", (topic.encode(), str(delay_ms).encode()), body, len(body)
    )


@pytest.mark.parametrize(
    ("name", "messages", "limits", "match"),
    [
        (b"PUB", [PublishMessage(b"x" * 11)], {"max_msg_size": 10}, r"11 bytes.* 10"),
        (b"PUB_TRACE", [PublishMessage(b"x" * 3, 1)], {"max_msg_size": 10}, r"11 bytes.* 10"),
        (b"PUB_EXT", [PublishMessage(b"x", None, b"{}")], {"max_msg_size": 4}, r"5 bytes.* 4"),
        (
            b"MPUB_TRACE",
            [PublishMessage(b"a"), PublishMessage(b"x" * 3)],
            {"max_msg_size": 10},
            r"message 1 .*11 bytes.* 10",
        ),
        (
            b"MPUB",
            [PublishMessage(b"ab"), PublishMessage(b"cd")],
            {"max_body_size": 15},
            r"16 bytes.* 15",
        ),
    ],
)
def test_a_publish_over_nsqds_limits_is_refused_before_the_session_records_it(
    name: bytes, messages: list[PublishMessage], limits: dict[str, int], match: str
) -> None:
    """The size nsqd compares (a traced message 8 bytes more, an ext one its header and 2) is
    checked against the limits the command carries; the session then has nothing pending."""
    session = ClientSession()
    session.start()
    session.identified(parse_identify_response(b'{"version": "0.3.7-HA.1.12.3"}'))
    session.ready()
    with pytest.raises(BodyTooLargeError, match=match):
        session.send(Publish(name, "t", 0, messages, **limits))
    assert session.pending == 0
    assert session.send(Publish(b"PUB", "t", 0, [PublishMessage(b"ok")])).endswith(b"ok")
