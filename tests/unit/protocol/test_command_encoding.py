"""Encoders of the commands without a message body, and their round trips."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsq_ha.errors import BodyTooLargeError, InvalidArgumentError, InvalidNameError
from nsq_ha.protocol import (
    MAGIC_V2,
    ClientCommand,
    CommandDecoder,
    StartKind,
    StartPosition,
    encode_auth,
    encode_cls,
    encode_fin,
    encode_identify,
    encode_internal_create_topic,
    encode_nop,
    encode_rdy,
    encode_req,
    encode_sub,
    encode_sub_advanced,
    encode_sub_ordered,
    encode_touch,
    ms_to_seconds,
    seconds_to_ms,
)
from nsq_ha.protocol import commands as commands_module

names = st.from_regex(r"[.a-zA-Z0-9_-]{1,54}(#ephemeral)?", fullmatch=True)
partitions = st.one_of(st.none(), st.just(-1), st.integers(0, 254))
fork_ids = st.binary(min_size=16, max_size=16).filter(lambda b: b[0] < 0x80 and any(b[:8]))


def decode_one(data: bytes) -> ClientCommand:
    """Decode exactly one command with the server-side decoder."""
    events = CommandDecoder(expect_magic=False).feed(data)
    assert len(events) == 1
    (command,) = events
    assert isinstance(command, ClientCommand)
    return command


def test_magic() -> None:
    assert MAGIC_V2 == b"  V2"


@pytest.mark.parametrize(
    ("encoded", "expected"),
    [
        (encode_sub("cf_pubsub", "ch", 0), b"SUB cf_pubsub ch 0\n"),
        (encode_sub("cf_vps", "ch"), b"SUB cf_vps ch\n"),
        (encode_sub_ordered("cf_ordered2", "ch", 0), b"SUB_ORDERED cf_ordered2 ch 0\n"),
        (encode_sub_advanced("cf_trace", "ch", 0), b"SUB_ADVANCED cf_trace ch 0\n"),
        (encode_sub_advanced("t", "c"), b"SUB_ADVANCED t c\n"),
        (
            encode_sub_advanced("t", "c", None, StartPosition.latest()),
            b"SUB_ADVANCED t c -1 special:-1\n",
        ),
        (
            encode_sub_advanced("t", "c", 3, StartPosition.at_offset(1024)),
            b"SUB_ADVANCED t c 3 virtual_queue:1024\n",
        ),
        (
            encode_sub_advanced("t", "c", 0, StartPosition.at_timestamp(1700000000)),
            b"SUB_ADVANCED t c 0 timestamp:1700000000\n",
        ),
        (
            encode_sub_advanced("t", "c", 0, StartPosition.at_count(3)),
            b"SUB_ADVANCED t c 0 msgcount:3\n",
        ),
        (encode_rdy(1), b"RDY 1\n"),
        (encode_rdy(0), b"RDY 0\n"),
        (encode_rdy(2500, max_rdy_count=2500), b"RDY 2500\n"),
        (encode_cls(), b"CLS\n"),
        (encode_nop(), b"NOP\n"),
        (encode_internal_create_topic("t", 0), b"INTERNAL_CREATE_TOPIC t 0 false\n"),
        (encode_internal_create_topic("t", 2, ext=True), b"INTERNAL_CREATE_TOPIC t 2 true\n"),
    ],
)
def test_exact_lines(encoded: bytes, expected: bytes) -> None:
    assert encoded == expected


def test_fin_req_touch_send_the_raw_id() -> None:
    message_id = bytes.fromhex("000000000000000a00000000000000 20".replace(" ", ""))
    assert encode_fin(message_id) == b"FIN " + message_id + b"\n"
    assert len(encode_fin(message_id)) == 21
    assert encode_touch(message_id) == b"TOUCH " + message_id + b"\n"
    assert len(encode_touch(message_id)) == 23
    assert encode_req(message_id) == b"REQ " + message_id + b" 0\n"
    assert encode_req(message_id, 5.0) == b"REQ " + message_id + b" 5000\n"
    assert encode_req(b"18a33cc8cb001001", 0) == b"REQ 18a33cc8cb001001 0\n"


@pytest.mark.parametrize(
    ("seconds", "milliseconds"),
    [(0, 0), (0.001, 1), (1.1, 1100), (1.005, 1005), (0.0004, 0), (0.0006, 1), (90, 90000)],
)
def test_seconds_to_ms_rounds(seconds: float, milliseconds: int) -> None:
    assert seconds_to_ms(seconds, "delay") == milliseconds


@pytest.mark.parametrize("seconds", [-0.001, math.inf, math.nan, "1", True, None])
def test_seconds_to_ms_refuses(seconds: object) -> None:
    with pytest.raises(InvalidArgumentError, match="delay"):
        seconds_to_ms(seconds, "delay")  # type: ignore[arg-type]


@given(st.integers(0, 10**12))
def test_ms_seconds_round_trip(milliseconds: int) -> None:
    assert seconds_to_ms(ms_to_seconds(milliseconds), "x") == milliseconds


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: encode_sub("bad!topic", "ch"), "topic name"),
        (lambda: encode_sub("t", "bad!ch"), "channel name"),
        (lambda: encode_sub("t", "c", 255), "partition"),
        (lambda: encode_sub_ordered("t" * 65, "c"), "topic name"),
        (lambda: encode_sub_advanced("t", "c", -2), "partition"),
        (lambda: encode_sub_advanced("t", "c", 0, "special:-1"), "StartPosition"),  # type: ignore[arg-type]
        (lambda: encode_rdy(-1), "RDY count"),
        (lambda: encode_rdy(2501, max_rdy_count=2500), "max_rdy_count 2500"),
        (lambda: encode_rdy(True), "RDY count"),
        (lambda: encode_rdy(1.0), "RDY count"),  # type: ignore[arg-type]
        (lambda: encode_fin(b"12345"), "16 bytes"),
        (lambda: encode_req(bytes(16)), "internal id"),
        (lambda: encode_req(b"0123456789abcdef", -1), "REQ delay"),
        (lambda: encode_touch("0123456789abcdef"), "bytes"),  # type: ignore[arg-type]
        (lambda: encode_internal_create_topic("t", None), "explicit partition"),  # type: ignore[arg-type]
        (lambda: encode_internal_create_topic("t", -1), "explicit partition"),
        (lambda: encode_auth(b""), "must not be empty"),
        (lambda: encode_auth(""), "must not be empty"),
        (lambda: encode_auth(123), "must be bytes"),  # type: ignore[arg-type]
        (lambda: encode_identify([("a", 1)]), "mapping"),  # type: ignore[arg-type]
        (lambda: encode_identify({"x": object()}), "JSON"),
        (lambda: encode_identify({"x": math.nan}), "JSON"),
    ],
)
def test_invalid_arguments_raise(call: object, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        call()  # type: ignore[operator]


def test_bad_names_raise_invalid_name_error_which_is_a_value_error() -> None:
    with pytest.raises(InvalidNameError):
        encode_sub("", "c")
    with pytest.raises(ValueError, match="channel"):
        encode_sub("t", "c c")


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        (StartKind.SPECIAL, 0),
        (StartKind.SPECIAL, -2),
        (StartKind.VIRTUAL_QUEUE, -1),
        (StartKind.TIMESTAMP, -5),
        (StartKind.MSGCOUNT, 0),
        (StartKind.VIRTUAL_QUEUE, 1 << 63),
        (StartKind.VIRTUAL_QUEUE, True),
        ("special", -1),
    ],
)
def test_invalid_start_positions(kind: StartKind, value: int) -> None:
    with pytest.raises(InvalidArgumentError):
        StartPosition(kind, value)


def test_identify_body_is_compact_and_ordered() -> None:
    body = {"client_id": "c", "feature_negotiation": True, "heartbeat_interval": 30000}
    encoded = encode_identify(body)
    payload = b'{"client_id":"c","feature_negotiation":true,"heartbeat_interval":30000}'
    assert encoded == b"IDENTIFY\n" + len(payload).to_bytes(4, "big") + payload
    assert encode_identify({"client_id": "é"}).endswith('{"client_id":"é"}'.encode())
    with pytest.raises(BodyTooLargeError, match="IDENTIFY body is 13 bytes, over the limit of 12"):
        encode_identify({"a": "12345"}, max_body_size=12)


def test_auth() -> None:
    assert encode_auth("s3cret") == b"AUTH\n\x00\x00\x00\x06s3cret"
    assert encode_auth(bytearray(b"x")) == b"AUTH\n\x00\x00\x00\x01x"  # type: ignore[arg-type]
    with pytest.raises(BodyTooLargeError):
        encode_auth(b"xx", max_body_size=1)


def test_wire_length_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commands_module, "MAX_WIRE_LENGTH", 4)
    with pytest.raises(BodyTooLargeError, match="over the limit of 4"):
        encode_auth(b"12345")


# --- round trips through the server-side decoder ----------------------------------------------


@given(
    names, names, partitions, st.sampled_from([encode_sub, encode_sub_ordered, encode_sub_advanced])
)
def test_subscribe_round_trip(
    topic: str, channel: str, partition: int | None, encode: object
) -> None:
    command = decode_one(encode(topic, channel, partition))  # type: ignore[operator]
    expected = (topic.encode(), channel.encode()) + (
        () if partition is None else (str(partition).encode(),)
    )
    assert command.params == expected
    assert command.name in (b"SUB", b"SUB_ORDERED", b"SUB_ADVANCED")


starts = st.one_of(
    st.just(StartPosition.latest()),
    st.builds(StartPosition.at_offset, st.integers(0, (1 << 63) - 1)),
    st.builds(StartPosition.at_timestamp, st.integers(0, 2**40)),
    st.builds(StartPosition.at_count, st.integers(1, 2**40)),
)


@given(names, names, partitions, starts)
def test_sub_advanced_with_start_round_trip(
    topic: str, channel: str, partition: int | None, start: StartPosition
) -> None:
    command = decode_one(encode_sub_advanced(topic, channel, partition, start))
    assert command.params[:2] == (topic.encode(), channel.encode())
    assert command.params[2] == str(-1 if partition is None else partition).encode()
    kind, _, value = command.params[3].decode().partition(":")
    assert StartPosition(StartKind(kind), int(value)) == start


@given(st.integers(0, 10**9))
def test_rdy_round_trip(count: int) -> None:
    assert decode_one(encode_rdy(count)) == ClientCommand(b"RDY", (str(count).encode(),))


@given(fork_ids, st.integers(0, 10**9))
def test_fin_req_touch_round_trip(message_id: bytes, delay_ms: int) -> None:
    assert decode_one(encode_fin(message_id)) == ClientCommand(b"FIN", (message_id,))
    assert decode_one(encode_touch(message_id)) == ClientCommand(b"TOUCH", (message_id,))
    req = decode_one(encode_req(message_id, ms_to_seconds(delay_ms)))
    assert req == ClientCommand(b"REQ", (message_id, str(delay_ms).encode()))


@given(st.dictionaries(st.text(max_size=10), st.one_of(st.integers(), st.booleans(), st.text())))
def test_identify_round_trip(body: dict[str, object]) -> None:
    command = decode_one(encode_identify(body))
    assert command.name == b"IDENTIFY"
    assert command.body is not None
    assert json.loads(command.body) == body
    assert list(json.loads(command.body)) == list(body)


@given(st.binary(min_size=1, max_size=100))
def test_auth_round_trip(secret: bytes) -> None:
    assert decode_one(encode_auth(secret)).body == secret


def test_cls_nop_create_round_trip() -> None:
    assert decode_one(encode_cls()) == ClientCommand(b"CLS")
    assert decode_one(encode_nop()) == ClientCommand(b"NOP")
    assert decode_one(encode_internal_create_topic("t", 4, ext=True)).params == (
        b"t",
        b"4",
        b"true",
    )
