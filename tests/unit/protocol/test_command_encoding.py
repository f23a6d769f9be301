"""The commands without a message body: exact bytes, checks, and round trips."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsq_ha.errors import BodyTooLargeError, InvalidArgumentError, InvalidNameError
from nsq_ha.protocol import (
    MAGIC_V2,
    Auth,
    Cls,
    Fin,
    Identify,
    Nop,
    Rdy,
    Req,
    StartKind,
    StartPosition,
    Sub,
    SubAdvanced,
    SubOrdered,
    Touch,
)
from nsq_ha.protocol import commands as commands_module
from nsq_ha.protocol.command_decoder import ClientCommand, CommandDecoder
from nsq_ha.protocol.commands import ms_to_seconds, seconds_to_ms

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
        (Sub("cf_pubsub", "ch", 0).encode(), b"SUB cf_pubsub ch 0\n"),
        (Sub("cf_vps", "ch").encode(), b"SUB cf_vps ch\n"),
        (SubOrdered("cf_ordered2", "ch", 0).encode(), b"SUB_ORDERED cf_ordered2 ch 0\n"),
        (SubAdvanced("cf_trace", "ch", 0).encode(), b"SUB_ADVANCED cf_trace ch 0\n"),
        (SubAdvanced("t", "c").encode(), b"SUB_ADVANCED t c\n"),
        (
            SubAdvanced("t", "c", None, StartPosition.latest()).encode(),
            b"SUB_ADVANCED t c -1 special:-1\n",
        ),
        (
            SubAdvanced("t", "c", 3, StartPosition.at_offset(1024)).encode(),
            b"SUB_ADVANCED t c 3 virtual_queue:1024\n",
        ),
        (
            SubAdvanced("t", "c", 0, StartPosition.at_timestamp(1700000000)).encode(),
            b"SUB_ADVANCED t c 0 timestamp:1700000000\n",
        ),
        (
            SubAdvanced("t", "c", 0, StartPosition.at_count(3)).encode(),
            b"SUB_ADVANCED t c 0 msgcount:3\n",
        ),
        (Rdy(1).encode(), b"RDY 1\n"),
        (Rdy(0).encode(), b"RDY 0\n"),
        (Rdy(2500).encode(), b"RDY 2500\n"),
        (Cls().encode(), b"CLS\n"),
        (Nop().encode(), b"NOP\n"),
    ],
)
def test_exact_lines(encoded: bytes, expected: bytes) -> None:
    assert encoded == expected


def test_fin_req_touch_send_the_raw_id() -> None:
    message_id = bytes.fromhex("000000000000000a00000000000000 20".replace(" ", ""))
    assert Fin(message_id).encode() == b"FIN " + message_id + b"\n"
    assert len(Fin(message_id).encode()) == 21
    assert Touch(message_id).encode() == b"TOUCH " + message_id + b"\n"
    assert len(Touch(message_id).encode()) == 23
    assert Req(message_id).encode() == b"REQ " + message_id + b" 0\n"
    assert Req(message_id, 5.0).encode() == b"REQ " + message_id + b" 5000\n"
    assert Req(b"18a33cc8cb001001", 0).encode() == b"REQ 18a33cc8cb001001 0\n"


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
        (lambda: Sub("bad!topic", "ch").encode(), "topic name"),
        (lambda: Sub("t", "bad!ch").encode(), "channel name"),
        (lambda: Sub("t", "c", 255).encode(), "partition"),
        (lambda: SubOrdered("t" * 65, "c").encode(), "topic name"),
        (lambda: SubAdvanced("t", "c", -2).encode(), "partition"),
        (lambda: SubAdvanced("t", "c", 0, "special:-1").encode(), "StartPosition"),  # type: ignore[arg-type]
        (lambda: Rdy(-1).encode(), "RDY count"),
        (lambda: Rdy(True).encode(), "RDY count"),
        (lambda: Rdy(1.0).encode(), "RDY count"),  # type: ignore[arg-type]
        (lambda: Fin(b"12345").encode(), "16 bytes"),
        (lambda: Req(bytes(16)).encode(), "internal id"),
        (lambda: Req(b"0123456789abcdef", -1).encode(), "REQ delay"),
        (lambda: Touch("0123456789abcdef").encode(), "bytes"),  # type: ignore[arg-type]
        (lambda: Auth.of(b"").encode(), "must not be empty"),
        (lambda: Auth.of("").encode(), "must not be empty"),
        (lambda: Auth.of(123).encode(), "must be bytes"),  # type: ignore[arg-type]
        (lambda: Identify.of([("a", 1)]).encode(), "mapping"),  # type: ignore[arg-type]
        (lambda: Identify.of({"x": object()}).encode(), "JSON"),
        (lambda: Identify.of({"x": math.nan}).encode(), "JSON"),
    ],
)
def test_invalid_arguments_raise(call: object, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        call()  # type: ignore[operator]


def test_bad_names_raise_invalid_name_error_which_is_a_value_error() -> None:
    with pytest.raises(InvalidNameError):
        Sub("", "c").encode()
    with pytest.raises(ValueError, match="channel"):
        Sub("t", "c c").encode()


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
    encoded = Identify.of(body).encode()
    payload = b'{"client_id":"c","feature_negotiation":true,"heartbeat_interval":30000}'
    assert encoded == b"IDENTIFY\n" + len(payload).to_bytes(4, "big") + payload
    assert Identify.of({"client_id": "é"}).encode().endswith('{"client_id":"é"}'.encode())
    with pytest.raises(BodyTooLargeError, match="IDENTIFY body is 13 bytes, over the limit of 12"):
        Identify.of({"a": "12345"}, max_body_size=12).encode()


def test_auth() -> None:
    assert Auth.of("s3cret").encode() == b"AUTH\n\x00\x00\x00\x06s3cret"
    assert Auth.of(bytearray(b"x")).encode() == b"AUTH\n\x00\x00\x00\x01x"  # type: ignore[arg-type]
    with pytest.raises(BodyTooLargeError):
        Auth.of(b"xx", max_body_size=1).encode()


def test_wire_length_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commands_module, "MAX_WIRE_LENGTH", 4)
    with pytest.raises(BodyTooLargeError, match="over the limit of 4"):
        Auth.of(b"12345").encode()


# --- round trips through the server-side decoder ----------------------------------------------


@given(names, names, partitions, st.sampled_from([Sub, SubOrdered, SubAdvanced]))
def test_subscribe_round_trip(
    topic: str, channel: str, partition: int | None, encode: object
) -> None:
    command = decode_one(encode(topic, channel, partition).encode())  # type: ignore[operator]
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
    command = decode_one(SubAdvanced(topic, channel, partition, start).encode())
    assert command.params[:2] == (topic.encode(), channel.encode())
    assert command.params[2] == str(-1 if partition is None else partition).encode()
    kind, _, value = command.params[3].decode().partition(":")
    assert StartPosition(StartKind(kind), int(value)) == start


@given(st.integers(0, 10**9))
def test_rdy_round_trip(count: int) -> None:
    assert decode_one(Rdy(count).encode()) == ClientCommand(b"RDY", (str(count).encode(),))


@given(fork_ids, st.integers(0, 10**9))
def test_fin_req_touch_round_trip(message_id: bytes, delay_ms: int) -> None:
    assert decode_one(Fin(message_id).encode()) == ClientCommand(b"FIN", (message_id,))
    assert decode_one(Touch(message_id).encode()) == ClientCommand(b"TOUCH", (message_id,))
    req = decode_one(Req(message_id, ms_to_seconds(delay_ms)).encode())
    assert req == ClientCommand(b"REQ", (message_id, str(delay_ms).encode()))


@given(st.dictionaries(st.text(max_size=10), st.one_of(st.integers(), st.booleans(), st.text())))
def test_identify_round_trip(body: dict[str, object]) -> None:
    command = decode_one(Identify.of(body).encode())
    assert command.name == b"IDENTIFY"
    assert command.body is not None
    assert json.loads(command.body) == body
    assert list(json.loads(command.body)) == list(body)


@given(st.binary(min_size=1, max_size=100))
def test_auth_round_trip(secret: bytes) -> None:
    assert decode_one(Auth.of(secret).encode()).body == secret


def test_cls_nop_round_trip() -> None:
    assert decode_one(Cls().encode()) == ClientCommand(b"CLS")
    assert decode_one(Nop().encode()) == ClientCommand(b"NOP")
